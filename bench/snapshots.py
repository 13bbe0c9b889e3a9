"""Snapshots and forks of a 512 MiB session per tier, each figure beside an anchor measured in
the same run: a snapshot's time and size beside a pause of the same session; a fork of 5 from
the snapshot until all 5 have answered an exec, beside 5 sessions started cold at once (one
`count` create) until all have answered; in the microvm tier those 5 are clone-pool restores,
and 5 guests booted cold (a shape the pool does not hold) are measured too. Run by
bench/snapshots.sh."""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import against_baseline, fmt  # noqa: E402
from pause import FILL, exec_py, spec_of, tier_rounds  # noqa: E402

FIGURES = ("snapshot_ms", "snapshot_mib", "pause_ms", "pause_mib", "fork5_ms", "cold5_ms")


def say(*parts):
    print("snapshots:", *parts, file=sys.stderr, flush=True)


def five(c, body):
    """Milliseconds from one create of 5 sessions of `body` to all 5 answering an exec."""
    t0 = time.perf_counter()
    group, _ = c.json("POST", "/v1/sessions", {**body, "count": 5}, want=(201,))
    ids = [s["id"] for s in group["sessions"]]
    try:
        for sid in ids:
            out, _ = exec_py(c, sid, "print(41 + 1)")
            if out["stdout"] != "42\n":
                raise RuntimeError(f"a session answered {out}")
        return (time.perf_counter() - t0) * 1000
    finally:
        for sid in ids:
            c.request("DELETE", f"/v1/sessions/{sid}")


def one_round(c, tier):
    info, _ = c.json("POST", "/v1/sessions", spec_of(tier), want=(201,))
    sid = info["id"]
    snap = None
    try:
        exec_py(c, sid, FILL)
        snap, dt = c.json("POST", f"/v1/sessions/{sid}/snapshot", {}, want=(201,))
        r = {"mechanism": snap["mechanism"], "snapshot_ms": dt * 1000,
             "snapshot_mib": snap["state_bytes"] / 2**20}
        r["fork5_ms"] = five(c, {"from_snapshot": snap["id"]})
        paused, dt = c.json("POST", f"/v1/sessions/{sid}/pause", {})
        r["pause_ms"], r["pause_mib"] = dt * 1000, paused["state_bytes"] / 2**20
        r["keep"] = paused["keep"]
        r["cold5_ms"] = five(c, spec_of(tier))
        if tier == "microvm":
            # A shape the pool does not hold: each guest boots.
            r["boot5_ms"] = five(c, {**spec_of(tier), "limits": {"memory": "513M"}})
        return r
    finally:
        c.request("DELETE", f"/v1/sessions/{sid}")
        if snap:
            c.request("DELETE", f"/v1/snapshots/{snap['id']}")


def main():
    a, done = tier_rounds(one_round, say, 900)
    figures, report = {}, {}
    for tier, rounds in done:
        keys = FIGURES + (("boot5_ms",) if tier == "microvm" else ())
        med = {k: statistics.median(r[k] for r in rounds) for k in keys}
        med["ratio_snapshot_to_pause"] = med["snapshot_ms"] / med["pause_ms"]
        med["ratio_fork5_to_cold5"] = med["fork5_ms"] / med["cold5_ms"]
        if tier == "microvm":
            med["ratio_fork5_to_boot5"] = med["fork5_ms"] / med["boot5_ms"]
        report[tier] = {"mechanism": rounds[0]["mechanism"], "keep": rounds[0]["keep"], **med}
        for k, v in med.items():
            figures[f"{tier}_{k}"] = v
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'tier':8} {'snapshot':17} {'ms':>8} {'MiB':>7} {'pause':7} {'ms':>8} {'MiB':>7} "
              f"{'snap/pause':>10} {'fork5 ms':>9} {'cold5 ms':>9} {'fork/cold':>9}")
        for tier, r in report.items():
            print(f"{tier:8} {r['mechanism']:17} {fmt(r['snapshot_ms'], '.0f'):>8} "
                  f"{fmt(r['snapshot_mib'], '.1f'):>7} {r['keep']:7} {fmt(r['pause_ms'], '.0f'):>8} "
                  f"{fmt(r['pause_mib'], '.1f'):>7} {fmt(r['ratio_snapshot_to_pause'], '.2f'):>10} "
                  f"{fmt(r['fork5_ms'], '.0f'):>9} {fmt(r['cold5_ms'], '.0f'):>9} "
                  f"{fmt(r['ratio_fork5_to_cold5'], '.2f'):>9}")
            if "boot5_ms" in r:
                print(f"{'':8} microvm cold5 are clone-pool restores; 5 guests booted cold: "
                      f"{fmt(r['boot5_ms'], '.0f')} ms (fork/boot "
                      f"{fmt(r['ratio_fork5_to_boot5'], '.2f')})")
    against_baseline("snapshots", figures)


if __name__ == "__main__":
    main()
