#!/usr/bin/python3
"""A volume's write speed beside its anchor, per tier, measured in the same run.

Started by bench/volumes.sh, which starts a server without pools. For each tier asked for
(native: an ext4 image on a loop device; microvm: the image as the guest's virtio-blk disk,
under TCG where KVM does not work), it makes a volume of twice the write's size (`for` the
tier's kind), opens one session of that tier with it mounted at /workspace/vol, and times,
inside the sandbox (`date +%s%N` around `dd if=/dev/zero bs=1M conv=fsync`), writing and
fsyncing BENCH_MIB MiB to the volume, against the same write to /workspace (the session's
tmpfs: its fsync returns at once), interleaved, each file removed after its round. Each tier's
figure is the ratio of the medians, volume over /workspace, both measured in its own session.
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


def measure(client, tier):
    """The tier's write times: (to the volume, to /workspace), N of each."""
    name = f"bench-{tier}"
    kind = "microvm" if tier == "microvm" else "host"
    client.json("POST", "/v1/volumes", {"name": name, "size": f"{2 * MIB}M", "for": kind},
                want=(201,))
    spec = {
        "limits": {"memory": f"{MIB + 512}M", "workspace_size": f"{MIB + 64}M", "timeout": "300s"},
        "volumes": [{"name": name, "path": "/workspace/vol"}],
    }
    if tier == "microvm":
        spec["tier"] = "microvm"
    try:
        session, _ = client.json("POST", "/v1/sessions", spec, want=(201,))
        sid = session["id"]
        volume, workspace = [], []
        try:
            for i in range(N):
                pair = [("vol", "/workspace/vol/f"), ("ws", "/workspace/f")]
                for which, path in (pair if i % 2 == 0 else pair[::-1]):
                    (volume if which == "vol" else workspace).append(timed_write(client, sid, path))
                say(f"{tier} round {i + 1}/{N}: volume {volume[-1] * 1000:.0f} ms, "
                    f"/workspace {workspace[-1] * 1000:.0f} ms")
        finally:
            client.request("DELETE", f"/v1/sessions/{sid}")
    finally:
        client.request("DELETE", f"/v1/volumes/{name}")
    return volume, workspace


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--tiers", default="native")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    client = Client(u.hostname, u.port, timeout=900.0)
    figures, ratios, extra, rows = {"mib": MIB, "rounds": N}, {}, {}, []
    for tier in args.tiers.split(","):
        volume, workspace = measure(client, tier)
        v, w = statistics.median(volume), statistics.median(workspace)
        # The native tier's keys are the ones its baseline has always had.
        prefix = "" if tier == "native" else f"{tier}_"
        ratios[f"{prefix}volume_vs_workspace"] = v / w
        extra[f"{prefix}volume_p50_ms"] = v * 1000
        extra[f"{prefix}workspace_p50_ms"] = w * 1000
        figures[tier] = {
            "volume_p50_ms": v * 1000, "workspace_p50_ms": w * 1000,
            "volume_mib_s": MIB / v, "workspace_mib_s": MIB / w,
            "volume_samples_ms": [round(x * 1000, 2) for x in volume],
            "workspace_samples_ms": [round(x * 1000, 2) for x in workspace],
        }
        rows.append((tier, v, w))
    if args.json:
        baseline = against_baseline("volumes", figures_of(ratios=ratios, extra=extra), show=False)
        print(json.dumps({"figures": figures, "ratios": ratios, "baseline": baseline}, indent=2))
        return
    print(f"{'write + fsync':<36}{'p50 ms':>10}{'MiB/s':>10}")
    for tier, v, w in rows:
        disk = "virtio-blk" if tier == "microvm" else "loop"
        print(f"{f'{tier} volume (ext4, {disk})':<36}{fmt(v * 1000, '.1f'):>10}{fmt(MIB / v, '.0f'):>10}")
        print(f"{f'{tier} /workspace (tmpfs)':<36}{fmt(w * 1000, '.1f'):>10}{fmt(MIB / w, '.0f'):>10}")
    for tier, v, w in rows:
        prefix = "" if tier == "native" else f"{tier}_"
        print(f"RATIO {prefix}volume_vs_workspace {v / w:.2f} (volume {v * 1000:.1f} ms / "
              f"/workspace {w * 1000:.1f} ms, {MIB} MiB, n={N})")
    against_baseline("volumes", figures_of(ratios=ratios, extra=extra))


if __name__ == "__main__":
    main()
