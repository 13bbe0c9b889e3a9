#!/usr/bin/python3
"""Start-latency benchmark: bare vs bubblewrap vs Kennel, measured in one interleaved run.

Normally started by bench/startup.sh, which builds Kennel and installs bubblewrap first.
Stdlib only; run it with the system interpreter (/usr/bin/python3), not a pyenv shim.

Every variant is started with subprocess.run(argv, stdin/stdout/stderr=DEVNULL) and timed
with time.perf_counter() around the call, so each figure is the wall-clock time from
"about to spawn" to "child reaped". The harness's own spawn cost is the same for every
variant, so it cancels out of the differences and barely moves the ratios.
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import against_baseline, figures_of, loadavg, print_starts, start_stats  # noqa: E402

PY = "/usr/bin/python3"

# (name, target, numerator variant, denominator variant). Ratios of medians.
RATIOS = [
    ("kennel_true_vs_bwrap_true", 1.0, "kennel_true", "bwrap_true"),
    ("kennel_python_vs_bare_python", 1.15, "kennel_python", "bare_python"),
    # No target was given for this one; Kennel should be no slower than bubblewrap, as for
    # /bin/true, so the same bar applies.
    ("kennel_python_vs_bwrap_python", 1.0, "kennel_python", "bwrap_python"),
]

# (name, minuend variant, subtrahend variant): absolute added start latency in ms (medians).
OVERHEADS = [
    ("kennel_python_minus_bare_python", "kennel_python", "bare_python"),
    ("kennel_true_minus_bare_true", "kennel_true", "bare_true"),
    ("bwrap_python_minus_bare_python", "bwrap_python", "bare_python"),
]


def variants(kennel, bwrap):
    bw = [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"] if bwrap else None
    kn = [kennel, "run", "--"] if kennel else None
    true, python = ["/bin/true"], [PY, "-c", "pass"]
    return [
        ("bare_true", true),
        ("bare_python", python),
        ("bwrap_true", bw and bw + true),
        ("bwrap_python", bw and bw + python),
        ("kennel_true", kn and kn + true),
        ("kennel_python", kn and kn + python),
    ]


def run_once(argv, capture=False):
    """Runs argv once; returns (seconds, returncode, stderr text or None)."""
    err = subprocess.PIPE if capture else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    t1 = time.perf_counter()
    text = p.stderr.decode(errors="replace").strip() if capture else None
    return t1 - t0, p.returncode, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--kennel", default=os.environ.get("KENNEL"), help="path of the kennel binary (omit to skip)")
    ap.add_argument("--bwrap", default=shutil.which("bwrap"), help="path of bwrap (omit to skip)")
    ap.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "50")), help="measured iterations")
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", "3")), help="warm-up rounds")
    ap.add_argument("--skip-note", action="append", default=[], metavar="NAME=WHY",
                    help="why a tool is skipped, recorded in the output")
    args = ap.parse_args()
    if args.n < 1:
        ap.error("BENCH_N must be at least 1")

    notes = dict(s.split("=", 1) if "=" in s else (s, "skipped") for s in args.skip_note)
    log = sys.stderr

    active, skipped = [], {}
    for name, argv in variants(args.kennel, args.bwrap):
        if argv is None:
            tool = "kennel" if name.startswith("kennel") else "bwrap"
            skipped[name] = notes.get(tool, f"{tool} not available")
            continue
        # Warm-up, and a check that the variant works at all: a failing run would be timed
        # as a (very fast) start otherwise.
        _, rc, err = run_once(argv, capture=True)
        if rc != 0:
            skipped[name] = f"exit status {rc}: {err[-300:] if err else '(no stderr)'}"
            continue
        active.append((name, argv))
    for name, why in skipped.items():
        print(f"startup: skipping {name}: {why}", file=log)
    if not active:
        print("startup: nothing to measure", file=log)
        return 2

    load_before = loadavg()
    gc.disable()
    # Warm-up rounds (page cache, dynamic loader, CPU frequency), not recorded.
    for _ in range(args.warmup):
        for _, argv in active:
            run_once(argv)

    samples = {name: [] for name, _ in active}
    failures = {name: 0 for name, _ in active}
    k = len(active)
    for i in range(args.n):
        # Round-robin, rotating the starting variant each iteration so no variant always
        # runs right after the same neighbour.
        for j in range(k):
            name, argv = active[(i + j) % k]
            dt, rc, _ = run_once(argv)
            if rc == 0:
                samples[name].append(dt * 1000.0)
            else:
                failures[name] += 1
    gc.enable()
    load_after = loadavg()

    stats = start_stats(active, samples, failures, skipped, args.n)

    ratios = {}
    for name, target, num, den in RATIOS:
        if num in stats and den in stats:
            value = stats[num]["median_ms"] / stats[den]["median_ms"]
            ratios[name] = {"value": value, "target": target, "status": "PASS" if value <= target else "MISS",
                            "p90_value": stats[num]["p90_ms"] / stats[den]["p90_ms"]}
        else:
            ratios[name] = {"value": None, "target": target, "status": "SKIP"}
    overheads = {}
    for name, a, b in OVERHEADS:
        overheads[name] = stats[a]["median_ms"] - stats[b]["median_ms"] if a in stats and b in stats else None

    result = {
        "n": args.n,
        "warmup": args.warmup,
        "method": "time.perf_counter around subprocess.run, stdio to /dev/null, round-robin per iteration",
        "host": {"nproc": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
                 "kernel": os.uname().release},
        "kennel": args.kennel,
        "bwrap": args.bwrap,
        "variants": stats,
        "skipped": skipped,
        "ratios": ratios,
        "overhead_ms": overheads,
    }

    medians = {f"{name}_median_ms": s["median_ms"] for name, s in stats.items()}
    figures = figures_of(overheads=overheads, ratios=ratios, extra=medians)
    if args.json:
        result["baseline"] = against_baseline("startup", figures, show=False)
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0

    print(f"start latency, {args.n} interleaved runs each after {args.warmup} warm-up rounds "
          f"({os.cpu_count()} CPUs, load {load_before[0] if load_before else '?'} -> "
          f"{load_after[0] if load_after else '?'})")
    print_starts([name for name, _ in active], stats, skipped, 15)
    print()
    for name, v in overheads.items():
        print(f"OVERHEAD {name} {'n/a' if v is None else f'{v:.2f}'} ms")
    for name, r in ratios.items():
        value = "n/a" if r["value"] is None else f"{r['value']:.3f}"
        print(f"RATIO {name} {value} {r['target']:.2f} {r['status']}")
    print()
    against_baseline("startup", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
