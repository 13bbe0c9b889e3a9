"""Pause and resume of a 512 MiB session per tier, each figure beside an anchor measured in
the same run: the pause's time and its state's size; the resume to the first exec answered,
beside a new session's start to its first exec (in the microvm tier a clone-pool restore, as
every microvm session of the default shape starts); and the resume's verification of a saved
state, apart. Run by bench/pause.sh."""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Client, against_baseline, fmt  # noqa: E402

# The session's python holds 64 MiB of its own, so that a saved state has memory to carry.
FILL = "x = bytearray(64 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\ny = 41"


def say(*parts):
    print("pause:", *parts, file=sys.stderr, flush=True)


def spec_of(tier):
    spec = {"limits": {"memory": "512M"}}
    if tier == "microvm":
        spec["tier"] = "microvm"
    elif tier != "native":
        spec["runtime"] = tier
    return spec


def exec_py(c, sid, code):
    result, dt = c.json("POST", f"/v1/sessions/{sid}/exec", {"language": "python", "code": code})
    if result.get("exit_code") != 0:
        raise RuntimeError(f"exec failed: {result}")
    return result, dt


def one_round(c, tier):
    t0 = time.perf_counter()
    info, _ = c.json("POST", "/v1/sessions", spec_of(tier), want=(201,))
    sid = info["id"]
    exec_py(c, sid, "y = 41")
    cold = (time.perf_counter() - t0) * 1000
    try:
        exec_py(c, sid, FILL)
        paused, dt = c.json("POST", f"/v1/sessions/{sid}/pause", {})
        pause_ms = dt * 1000
        t1 = time.perf_counter()
        report, _ = c.json("POST", f"/v1/sessions/{sid}/resume")
        out, _ = exec_py(c, sid, "print(y + 1)")
        resume = (time.perf_counter() - t1) * 1000
        if out["stdout"] != "42\n":
            raise RuntimeError(f"the resumed session lost its state: {out}")
        return {
            "keep": paused["keep"], "mechanism": paused["mechanism"],
            "cold_ms": cold, "pause_ms": pause_ms, "state_mib": paused["state_bytes"] / 2**20,
            "resume_ms": resume, "verify_ms": report["verify_ms"],
        }
    finally:
        c.request("DELETE", f"/v1/sessions/{sid}")


def tier_rounds(one_round, say, timeout):
    """Parses --url, --tiers, --rounds and --json, and runs `one_round(client, tier)` that
    many times per tier, saying each: (the arguments, [(tier, [its rounds])])."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--tiers", default="native")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    host, port = a.url.split("//")[1].split(":")
    c = Client(host, int(port), timeout=timeout)
    done = []
    for tier in a.tiers.split(","):
        rounds = []
        for i in range(a.rounds):
            rounds.append(one_round(c, tier))
            say(tier, "round", i + 1, json.dumps(rounds[-1]))
        done.append((tier, rounds))
    return a, done


def main():
    a, done = tier_rounds(one_round, say, 600)
    figures, report = {}, {}
    for tier, rounds in done:
        med = {k: statistics.median(r[k] for r in rounds)
               for k in ("cold_ms", "pause_ms", "state_mib", "resume_ms", "verify_ms")}
        med["ratio_resume_to_cold"] = med["resume_ms"] / med["cold_ms"]
        report[tier] = {"keep": rounds[0]["keep"], "mechanism": rounds[0]["mechanism"], **med}
        for k, v in med.items():
            figures[f"{tier}_{k}"] = v
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'tier':9} {'keep':7} {'mechanism':13} {'pause ms':>9} {'state MiB':>10} "
              f"{'resume ms':>10} {'verify ms':>10} {'cold ms':>9} {'resume/cold':>12}")
        for tier, r in report.items():
            print(f"{tier:9} {r['keep']:7} {r['mechanism']:13} {fmt(r['pause_ms'], '.1f'):>9} "
                  f"{fmt(r['state_mib'], '.1f'):>10} {fmt(r['resume_ms'], '.1f'):>10} "
                  f"{fmt(r['verify_ms'], '.0f'):>10} {fmt(r['cold_ms'], '.1f'):>9} "
                  f"{fmt(r['ratio_resume_to_cold'], '.2f'):>12}")
        print("E2B's published figures: pause about 4 s per GiB, resume about 1 s.")
    against_baseline("pause", figures)


if __name__ == "__main__":
    main()
