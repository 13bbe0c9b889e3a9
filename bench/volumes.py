#!/usr/bin/python3
"""A volume's write speed beside its anchor, measured in the same run.

Started by bench/volumes.sh, which starts a server without pools on a state directory of its
own. It makes a volume of twice the write's size, opens one native session with it mounted
at /workspace/vol, and times, inside the sandbox (`date +%s%N` around `dd if=/dev/zero
bs=1M conv=fsync`), writing and fsyncing BENCH_MIB MiB to the volume, against the same write
to /workspace (the session's tmpfs: its fsync returns at once), interleaved, each file removed
after its round. The figure is the ratio of the medians, volume over /workspace.
"""

import argparse
import json
import os
import statistics
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Client, against_baseline, figures_of, fmt  # noqa: E402

N = int(os.environ.get("BENCH_N", "5"))
MIB = int(os.environ.get("BENCH_MIB", "256"))
VOLUME = "bench-volume"


def say(*parts):
    print("volumes:", *parts, file=sys.stderr, flush=True)


def timed_write(client, sid, path):
    """Seconds the sandbox took to write and fsync MIB MiB to `path` (then removed)."""
    code = (f"s=$(date +%s%N); dd if=/dev/zero of={path} bs=1M count={MIB} conv=fsync "
            f"status=none; e=$(date +%s%N); rm -f {path}; echo $((e - s))")
    r, _ = client.json("POST", f"/v1/sessions/{sid}/exec",
                       {"language": "bash", "code": code, "timeout": "300s"})
    if r.get("exit_code") != 0:
        raise SystemExit(f"volumes: the write to {path} failed: {r}")
    return int(r["stdout"].strip()) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    client = Client(u.hostname, u.port, timeout=600.0)
    client.json("POST", "/v1/volumes", {"name": VOLUME, "size": f"{2 * MIB}M"}, want=(201,))
    session, _ = client.json("POST", "/v1/sessions", {
        "limits": {"memory": f"{MIB + 512}M", "workspace_size": f"{MIB + 64}M", "timeout": "300s"},
        "volumes": [{"name": VOLUME, "path": "/workspace/vol"}],
    }, want=(201,))
    sid = session["id"]
    volume, workspace = [], []
    try:
        for i in range(N):
            pair = [("vol", "/workspace/vol/f"), ("ws", "/workspace/f")]
            for which, path in (pair if i % 2 == 0 else pair[::-1]):
                (volume if which == "vol" else workspace).append(timed_write(client, sid, path))
            say(f"round {i + 1}/{N}: volume {volume[-1] * 1000:.0f} ms, /workspace {workspace[-1] * 1000:.0f} ms")
    finally:
        client.request("DELETE", f"/v1/sessions/{sid}")
        client.request("DELETE", f"/v1/volumes/{VOLUME}")
    v, w = statistics.median(volume), statistics.median(workspace)
    ratio = v / w
    figures = {
        "mib": MIB, "rounds": N,
        "volume_p50_ms": v * 1000, "workspace_p50_ms": w * 1000,
        "volume_mib_s": MIB / v, "workspace_mib_s": MIB / w,
        "volume_samples_ms": [round(x * 1000, 2) for x in volume],
        "workspace_samples_ms": [round(x * 1000, 2) for x in workspace],
    }
    ratios = {"volume_vs_workspace": ratio}
    if args.json:
        baseline = against_baseline("volumes", figures_of(ratios=ratios, extra={
            "volume_p50_ms": v * 1000, "workspace_p50_ms": w * 1000}), show=False)
        print(json.dumps({"figures": figures, "ratios": ratios, "baseline": baseline}, indent=2))
        return
    print(f"{'write + fsync':<24}{'p50 ms':>10}{'MiB/s':>10}")
    print(f"{'volume (ext4, loop)':<24}{fmt(v * 1000, '.1f'):>10}{fmt(MIB / v, '.0f'):>10}")
    print(f"{'/workspace (tmpfs)':<24}{fmt(w * 1000, '.1f'):>10}{fmt(MIB / w, '.0f'):>10}")
    print(f"RATIO volume_vs_workspace {ratio:.2f} (volume {v * 1000:.1f} ms / /workspace {w * 1000:.1f} ms, {MIB} MiB, n={N})")
    against_baseline("volumes", figures_of(ratios=ratios, extra={
        "volume_p50_ms": v * 1000, "workspace_p50_ms": w * 1000}))


if __name__ == "__main__":
    main()
