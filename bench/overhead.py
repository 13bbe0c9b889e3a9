#!/usr/bin/python3
"""What the sandbox costs code that is already running: a CPU-bound loop timed from inside
(bare against `kennel run`), and a 1 GiB stdout flood (the supervisor's drain rate and peak RSS).

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

from harness import against_baseline  # noqa: E402

PY = "/usr/bin/python3"
# A pure-python loop of about 2 s that times itself, so that no start-up is counted.
LOOP = ("import time\nt = time.perf_counter()\nn = 0\nfor i in range(50_000_000): n += i\n"
        "print(time.perf_counter() - t)")
FLOOD_BYTES = 1 << 30


def loop_seconds(argv):
    out = subprocess.run(argv + [PY, "-c", LOOP], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


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
    for _ in range(args.n):
        bare.append(loop_seconds([]))
        sandboxed.append(loop_seconds([args.kennel, "run", "--"]))
        s, peak = flood(args.kennel)
        drains.append(FLOOD_BYTES / s / 1e9)
        rss.append(peak)
    figures = {
        "cpu_loop_bare_s": statistics.median(bare),
        "cpu_loop_kennel_s": statistics.median(sandboxed),
        "cpu_loop_overhead_pct": (statistics.median(sandboxed) / statistics.median(bare) - 1) * 100,
        "flood_drain_gb_per_s": statistics.median(drains),
        "flood_supervisor_peak_rss_mib": max(rss),
    }
    targets = {"cpu_loop_overhead_pct": ("<=", 2.0), "flood_drain_gb_per_s": (">=", 1.0),
               "flood_supervisor_peak_rss_mib": ("<=", 32.0)}
    out = {"n": args.n, "figures": figures, "targets": targets}
    if args.json:
        out["baseline"] = against_baseline("overhead", figures, show=False)
        print(json.dumps(out, indent=1))
        return
    print(f"overhead benchmark, {args.n} rounds, medians (peak RSS: the largest):")
    for k, v in figures.items():
        t = targets.get(k)
        goal = f"target {t[0]} {t[1]}: {'met' if (v <= t[1] if t[0] == '<=' else v >= t[1]) else 'missed'}" if t else ""
        print(f"  {k:32} {v:9.3f}  {goal}")
    print()
    against_baseline("overhead", figures)


if __name__ == "__main__":
    main()
