#!/usr/bin/python3
"""MicroVM clones in the server's pool, measured beside runsc and a cold microvm run.

Started by bench/clones.sh, which prepares the guest and the image and starts a server whose
pool keeps `--pool` clones of the image. Stdlib only; run with /usr/bin/python3.

- fill: seconds until the pool is full from the server's start (the first clone takes the
  image's snapshot when it is missing: boot, preloads imported, saved), then again after one
  clone is taken (a restore);
- PSS per idle clone: each QEMU under the server, from /proc/PID/smaps_rollup, with the pool
  full and idle: pages of the snapshot's RAM file that clones share count partly to each;
- pooled: HTTP wall time of a pandas run served by a clone, each on a full, settled pool;
- anchors, same code: `kennel run --runtime runsc --image IMAGE` and a cold
  `kennel run --tier microvm --image IMAGE` (snapshots off: it boots and imports).
"""

import argparse
import json
import os
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Client, against_baseline, check_argv, figures_of, check_targets, descendants, fmt, print_targets, run_argv,  # noqa: E402
                     run_ok, summary)

CODE = "import pandas, numpy; print(pandas.DataFrame({'a': [1]}).a.sum())"  # prints "1\n"
TARGETS = [("pooled_p50_ms", 400.0, "<=")]


def say(*parts):
    print("clones:", *parts, file=sys.stderr, flush=True)


def ready(client, image):
    health, _ = client.json("GET", "/healthz")
    return health["pool"]["microvm"].get(image, 0)


def wait_full(client, image, size, limit):
    t0 = time.perf_counter()
    while ready(client, image) < size:
        if time.perf_counter() - t0 > limit:
            raise RuntimeError(f"{size} clones of {image} not ready in {limit:.0f} s")
        time.sleep(0.05)
    return time.perf_counter() - t0


def memory_of_clones(server_pid):
    """{pss_mib, rss_mib, shared_mib} per QEMU under the server."""
    found = []
    for p in descendants(server_pid):
        try:
            with open(f"/proc/{p}/comm") as f:
                if not f.read().startswith("qemu-system"):
                    continue
            with open(f"/proc/{p}/smaps_rollup") as f:
                # "Pss:   46764 kB" lines, after the mapping's header line.
                kb = {line.split(":")[0]: int(line.split()[1]) for line in f if line.endswith(" kB\n")}
        except OSError:
            continue
        found.append({"pss_mib": kb["Pss"] / 1024, "rss_mib": kb["Rss"] / 1024,
                      "shared_mib": (kb["Shared_Clean"] + kb["Shared_Dirty"]) / 1024})
    return found


def main():
    ap = argparse.ArgumentParser()
    for a in ("--url", "--image", "--kennel"):
        ap.add_argument(a, required=True)
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--pool", type=int, required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    client = Client(u.hostname, u.port, timeout=600)
    n = int(os.environ.get("BENCH_N", "10"))
    anchor_n = int(os.environ.get("BENCH_ANCHOR_N", "5"))
    cold_n = int(os.environ.get("BENCH_COLD_N", "1"))

    first_fill = wait_full(client, args.image, args.pool, 900)
    say(f"pool full after {first_fill:.1f} s")
    time.sleep(2)
    clones = memory_of_clones(args.server_pid)
    body = {"language": "python", "code": CODE, "tier": "microvm", "image": args.image}
    pooled, refills = [], []
    for i in range(n):
        wait_full(client, args.image, args.pool, 600)
        time.sleep(0.5)
        status, payload, dt = client.request("POST", "/v1/runs", body)
        ok, result = run_ok(status, payload)
        if not ok:
            raise RuntimeError(f"pooled run {i}: HTTP {status}: {payload[:300]!r}")
        pooled.append(dt)
        refills.append(wait_full(client, args.image, args.pool, 600))

    runsc = [args.kennel, "run", "--runtime", "runsc", "--image", args.image, "--",
             "/usr/bin/python3", "-c", CODE]
    cold = [args.kennel, "run", "--tier", "microvm", "--image", args.image, "--timeout", "300s",
            "--", "/usr/bin/python3", "-c", CODE]
    anchors = {}
    for name, argv, count in (("runsc", runsc, anchor_n), ("cold_microvm", cold, cold_n)):
        env_off = name == "cold_microvm"
        if env_off:
            os.environ["KENNEL_VM_SNAPSHOTS"] = "0"
        why = check_argv(argv)
        if why:
            raise RuntimeError(f"{name}: {why}")
        anchors[name] = [run_argv(argv)[0] for _ in range(count)]
        os.environ.pop("KENNEL_VM_SNAPSHOTS", None)

    ms = lambda xs: [x * 1000 for x in xs]  # noqa: E731
    p50 = lambda xs: summary(ms(xs))["p50_ms"]  # noqa: E731
    values = {"pooled_p50_ms": p50(pooled)}
    out = {
        "pool": args.pool,
        "first_fill_s": first_fill,
        "refill_after_take_ms": summary(ms(refills)),
        "idle_clones": clones,
        "pooled": summary(ms(pooled)),
        "runsc": summary(ms(anchors["runsc"])),
        "cold_microvm": summary(ms(anchors["cold_microvm"])),
        "ratios": {
            "pooled_vs_runsc": p50(pooled) / p50(anchors["runsc"]),
            "pooled_vs_cold_microvm": p50(pooled) / p50(anchors["cold_microvm"]),
        },
        "targets": check_targets(TARGETS, values),
    }
    p50s = {f"{k}_p50_ms": (out[k] or {}).get("p50_ms") for k in ("pooled", "runsc", "cold_microvm")}
    figures = figures_of(ratios=out["ratios"], targets=out["targets"], extra=p50s)
    if args.json:
        against_baseline("clones", figures, show=False)
        print(json.dumps(out, indent=2))
        return
    refill = out["refill_after_take_ms"]["p50_ms"] / 1000
    print(f"FILL first {first_fill:.1f} s; refill after a take p50 {refill:.1f} s")
    for i, c in enumerate(clones):
        print(f"CLONE {i} pss {c['pss_mib']:.0f} MiB rss {c['rss_mib']:.0f} MiB shared {c['shared_mib']:.0f} MiB")
    for name in ("pooled", "runsc", "cold_microvm"):
        s = out[name]
        print(f"RUN {name} p50 {fmt(s['p50_ms'])} ms p99 {fmt(s['p99_ms'])} ms runs {s['runs']}")
    for name, r in out["ratios"].items():
        print(f"RATIO {name} {r:.3f}")
    print_targets(out["targets"])
    print()
    against_baseline("clones", figures)


if __name__ == "__main__":
    main()
