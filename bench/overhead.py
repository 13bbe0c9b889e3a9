#!/usr/bin/python3
"""What the sandbox costs code that is already running: a CPU-bound loop and a numpy matmul
(the python-data image's numpy, chrooted bare), each timed from inside (bare against `kennel
run`), and a 1 GiB stdout flood (the supervisor's drain rate and peak RSS).

Normally started by bench/overhead.sh, which builds Kennel first. Stdlib only; run it with the
system interpreter. Each round runs every variant once, in turn; figures are medians. The last
figures are kept in bench/baselines/overhead.json and each run prints its change against them
(information only: this machine is shared and noisy).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import against_baseline, check_targets, print_targets  # noqa: E402

PY = "/usr/bin/python3"
# A pure-python loop of about 2 s that times itself, so that no start-up is counted.
LOOP = ("import time\nt = time.perf_counter()\nn = 0\nfor i in range(50_000_000): n += i\n"
        "print(time.perf_counter() - t)")
FLOOD_BYTES = 1 << 30
# numpy's matmul, one BLAS thread (the sandbox has one CPU), about 2 s, timed from inside.
MATMUL = ("import time\nimport numpy as np\na = np.random.default_rng(1).random((400, 400))\n"
          "t = time.perf_counter()\nfor _ in range(800): a @ a\nprint(time.perf_counter() - t)")
IMAGE = "python-data"
STATE = os.environ.get("KENNEL_STATE_DIR", "/var/cache/kennel-tests/state")
# (name, target, direction) from issue 19.
TARGETS = [
    ("cpu_loop_overhead_pct", 2.0, "<="),
    ("matmul_overhead_pct", 2.0, "<="),
    ("flood_drain_gb_per_s", 1.0, ">="),
    ("flood_supervisor_peak_rss_mib", 32.0, "<="),
]


def loop_seconds(argv, code=LOOP):
    out = subprocess.run(argv + [PY, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def matmul_argvs(kennel):
    """(bare, sandboxed) argv prefixes for the matmul: the image's own interpreter and numpy,
    chrooted bare and `kennel run --image` sandboxed; None (and why) without the image."""
    root = os.path.join(STATE, "images", "names", IMAGE, "rootfs")
    if not os.path.isdir(os.path.join(root, "usr")):
        return None, f"no image {IMAGE} in {STATE} (bench/images.sh builds it)"
    if os.geteuid() != 0:
        return None, "the bare matmul chroots into the image, which needs root"
    # Bare gets the sandbox's clean environment: an inherited OPENBLAS_CORETYPE (this
    # machine's environment sets one) would pick another BLAS kernel.
    bare = ["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "OPENBLAS_NUM_THREADS=1",
            "/usr/sbin/chroot", root]
    sandboxed = ["/usr/bin/env", f"KENNEL_STATE_DIR={STATE}", kennel, "run", "--image", IMAGE,
                 "--env", "OPENBLAS_NUM_THREADS=1", "--"]
    return (bare, sandboxed), None


def flood(kennel):
    """Seconds for `kennel run` to drain FLOOD_BYTES of stdout, and its peak RSS in MiB."""
    argv = [kennel, "run", "--timeout", "120s", "--", "/usr/bin/head", "-c", str(FLOOD_BYTES),
            "/dev/zero"]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"overhead.py: the flood failed ({p.returncode}): {p.stderr.read().decode()[-400:]}")
    # ru_maxrss of a waited child: the largest of it and the descendants it waited for (the
    # helper and the code, all small), in KiB.
    return seconds, usage.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kennel", required=True)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "5")))
    args = ap.parse_args()
    bare, sandboxed, drains, rss = [], [], [], []
    matmul, why = matmul_argvs(args.kennel)
    mm_bare, mm_sandboxed = [], []
    if why:
        print(f"overhead.py: no numpy matmul: {why}", file=sys.stderr)
    for _ in range(args.n):
        bare.append(loop_seconds([]))
        sandboxed.append(loop_seconds([args.kennel, "run", "--"]))
        if matmul:
            mm_bare.append(loop_seconds(matmul[0], MATMUL))
            mm_sandboxed.append(loop_seconds(matmul[1], MATMUL))
        s, peak = flood(args.kennel)
        drains.append(FLOOD_BYTES / s / 1e9)
        rss.append(peak)
    figures = {
        "cpu_loop_bare_s": statistics.median(bare),
        "cpu_loop_kennel_s": statistics.median(sandboxed),
        "cpu_loop_overhead_pct": (statistics.median(sandboxed) / statistics.median(bare) - 1) * 100,
        **({"matmul_bare_s": statistics.median(mm_bare),
            "matmul_kennel_s": statistics.median(mm_sandboxed),
            "matmul_overhead_pct": (statistics.median(mm_sandboxed) / statistics.median(mm_bare) - 1) * 100}
           if matmul else {}),
        "flood_drain_gb_per_s": statistics.median(drains),
        "flood_supervisor_peak_rss_mib": max(rss),
    }
    targets = check_targets(TARGETS, {name: figures.get(name) for name, _, _ in TARGETS})
    out = {"n": args.n, "figures": figures, "targets": targets}
    if args.json:
        out["baseline"] = against_baseline("overhead", figures, show=False)
        print(json.dumps(out, indent=1))
        return
    print(f"overhead benchmark, {args.n} rounds, medians (peak RSS: the largest):")
    for k, v in figures.items():
        print(f"  {k:32} {v:9.3f}")
    print()
    print_targets(targets)
    print()
    against_baseline("overhead", figures)


if __name__ == "__main__":
    main()
