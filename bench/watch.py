#!/usr/bin/python3
"""Cost of watching: Kennel with the seccomp listener on (with and without the exec log) and
off, with bare runs as anchors.

Normally started by bench/watch.sh, which builds Kennel first. Stdlib only; run it with the
system interpreter (/usr/bin/python3). Each round runs every variant once, in order, so that
the machine's noise falls on all of them alike; the figures are medians of wall-clock times
from spawn to reap.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import against_baseline, figures_of  # noqa: E402

PY = "/usr/bin/python3"
STAT = "import os\nfor _ in range(100000): os.stat('/')"
EXECS = "i=0; while [ $i -lt 200 ]; do /bin/true; i=$((i+1)); done"
WORKLOADS = [
    ("true", ["/bin/true"]),
    ("stat100k", [PY, "-c", STAT]),
    ("exec200", ["/bin/sh", "-c", EXECS]),
]
# (name, target): watched over unwatched, per workload; benign code should pay nothing.
TARGET = 1.05


def timed(argv):
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    t1 = time.perf_counter()
    if p.returncode != 0:
        sys.exit(f"watch.py: {argv[:4]} failed ({p.returncode}): {p.stderr.decode()[-400:]}")
    return t1 - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kennel", required=True)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "20")))
    args = ap.parse_args()
    policies = {}
    for name, text in [("unwatched", "[layers]\nwatch = false\n"),
                       ("noexeclog", "[layers]\nexec_log = false\n")]:
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(text)
            policies[name] = f.name
    try:
        variants = []
        for w, argv in WORKLOADS:
            variants.append((f"bare_{w}", argv))
            variants.append((f"watched_{w}", [args.kennel, "run", "--"] + argv))
            for name, path in policies.items():
                variants.append((f"{name}_{w}", [args.kennel, "run", "--policy", path, "--"] + argv))
        for _, argv in variants:  # warm-up
            timed(argv)
        samples = {name: [] for name, _ in variants}
        for _ in range(args.n):
            for name, argv in variants:
                samples[name].append(timed(argv))
    finally:
        for path in policies.values():
            os.unlink(path)
    p50 = {k: statistics.median(v) * 1000 for k, v in samples.items()}
    ratios = {f"watched_vs_unwatched_{w}": p50[f"watched_{w}"] / p50[f"unwatched_{w}"]
              for w, _ in WORKLOADS}
    ratios.update({f"noexeclog_vs_unwatched_{w}": p50[f"noexeclog_{w}"] / p50[f"unwatched_{w}"]
                   for w, _ in WORKLOADS})
    anchors = {f"watched_vs_bare_{w}": p50[f"watched_{w}"] / p50[f"bare_{w}"] for w, _ in WORKLOADS}
    out = {"n": args.n, "p50_ms": p50, "ratios": ratios, "anchors": anchors,
           "target_watched_vs_unwatched": TARGET,
           "met": {k: v <= TARGET for k, v in ratios.items()}}
    figures = figures_of(ratios={**ratios, **anchors}, extra={f"{k}_p50_ms": v for k, v in p50.items()})
    if args.json:
        out["baseline"] = against_baseline("watch", figures, show=False)
        print(json.dumps(out, indent=1))
        return
    print(f"watch benchmark, {args.n} interleaved rounds, medians (ms):")
    for w, _ in WORKLOADS:
        print(f"  {w:9} bare {p50[f'bare_{w}']:7.1f}   watched {p50[f'watched_{w}']:7.1f}   "
              f"no exec log {p50[f'noexeclog_{w}']:7.1f}   unwatched {p50[f'unwatched_{w}']:7.1f}   "
              f"watched/unwatched {ratios[f'watched_vs_unwatched_{w}']:.3f}   "
              f"no-exec-log/unwatched {ratios[f'noexeclog_vs_unwatched_{w}']:.3f} "
              f"(target <= {TARGET})   watched/bare {anchors[f'watched_vs_bare_{w}']:.2f}")
    print()
    against_baseline("watch", figures)


if __name__ == "__main__":
    main()
