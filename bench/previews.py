#!/usr/bin/python3
"""A GET through a preview URL beside its anchor, measured in the same run.

Started by bench/previews.sh, which starts a server without pools. For each tier asked for
(native; crun) it opens one session, starts `python3 -m http.server` on 127.0.0.1:3000 in it
serving a 1 KiB file, and opens port 3000 to previews. Then, interleaved in rounds of 20, it
GETs the file N times with `curl` on the host through the path-form preview URL (the token in
the `X-Kennel-Token` header; Kennel opens a connection in the sandbox's network namespace per
request), and N times with `curl` inside the sandbox to 127.0.0.1:3000 (one exec running the
round's curls). Both are timed by curl itself (`%{time_total}`: the exchange, not curl's
start), so the figure is what the preview path adds to the same request. Each tier's RATIO is
p50 over p50 (and p99 over p99).
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import Client, against_baseline, figures_of, fmt, percentile  # noqa: E402

N = int(os.environ.get("BENCH_N", "200"))
ROUND = 20
CURL = "curl -s -o /dev/null -w '%{time_total}\\n'"


def say(*parts):
    print("previews:", *parts, file=sys.stderr, flush=True)


def through_preview(url, token, n):
    """Seconds of `n` GETs with curl on the host through the preview."""
    out = subprocess.run(
        ["sh", "-c", f"for i in $(seq {n}); do {CURL} -H 'X-Kennel-Token: {token}' '{url}'; done"],
        check=True, capture_output=True, text=True).stdout
    return [float(x) for x in out.split()]


def inside(client, sid, n):
    """Seconds of `n` GETs with curl inside the sandbox to the same port."""
    code = f"for i in $(seq {n}); do {CURL} http://127.0.0.1:3000/file; done"
    r, _ = client.json("POST", f"/v1/sessions/{sid}/exec", {"language": "bash", "code": code})
    if r.get("exit_code") != 0:
        raise SystemExit(f"previews: curl inside the sandbox failed: {r}")
    return [float(x) for x in r["stdout"].split()]


def measure(client, base, tier):
    spec = {} if tier == "native" else {"runtime": tier}
    session, _ = client.json("POST", "/v1/sessions", spec, want=(201,))
    sid = session["id"]
    try:
        client.json("POST", f"/v1/sessions/{sid}/exec",
                    {"language": "bash", "code": "head -c 1024 /dev/zero > /workspace/file"})
        client.json("POST", f"/v1/sessions/{sid}/processes",
                    {"cmd": "python3 -m http.server 3000 --bind 127.0.0.1"}, want=(201,))
        port, _ = client.json("POST", f"/v1/sessions/{sid}/ports", {"port": 3000}, want=(201,))
        url = f"{base}/p/{sid}/3000/file"
        deadline = time.monotonic() + 30
        while True:
            code = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                                   f"X-Kennel-Token: {port['token']}", url],
                                  capture_output=True, text=True).stdout
            if code == "200":
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"previews: the app never answered through the preview ({code})")
            time.sleep(0.1)
        preview, anchor = [], []
        for i in range(0, N, ROUND):
            k = min(ROUND, N - i)
            if (i // ROUND) % 2 == 0:
                preview += through_preview(url, port["token"], k)
                anchor += inside(client, sid, k)
            else:
                anchor += inside(client, sid, k)
                preview += through_preview(url, port["token"], k)
        say(f"{tier}: {len(preview)} GETs through the preview, {len(anchor)} inside")
        return preview, anchor
    finally:
        client.request("DELETE", f"/v1/sessions/{sid}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--tiers", default="native")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    client = Client(u.hostname, u.port, timeout=300.0)
    base = args.url.rstrip("/")
    figures, ratios, extra, rows = {"rounds": N}, {}, {}, []
    for tier in args.tiers.split(","):
        preview, anchor = measure(client, base, tier)
        p50, p99 = percentile(preview, 50) * 1000, percentile(preview, 99) * 1000
        a50, a99 = percentile(anchor, 50) * 1000, percentile(anchor, 99) * 1000
        prefix = "" if tier == "native" else f"{tier}_"
        ratios[f"{prefix}preview_vs_inside_p50"] = p50 / a50
        ratios[f"{prefix}preview_vs_inside_p99"] = p99 / a99
        extra.update({f"{prefix}preview_p50_ms": p50, f"{prefix}inside_p50_ms": a50})
        figures[tier] = {"preview_p50_ms": p50, "preview_p99_ms": p99,
                         "inside_p50_ms": a50, "inside_p99_ms": a99,
                         "preview_samples_ms": [round(x * 1000, 3) for x in preview],
                         "inside_samples_ms": [round(x * 1000, 3) for x in anchor]}
        rows.append((tier, p50, p99, a50, a99))
    if args.json:
        baseline = against_baseline("previews", figures_of(ratios=ratios, extra=extra), show=False)
        print(json.dumps({"figures": figures, "ratios": ratios, "baseline": baseline}, indent=2))
        return
    print(f"{'GET of 1 KiB':<40}{'p50 ms':>10}{'p99 ms':>10}")
    for tier, p50, p99, a50, a99 in rows:
        print(f"{f'{tier} through the preview (host curl)':<40}{fmt(p50, '.2f'):>10}{fmt(p99, '.2f'):>10}")
        print(f"{f'{tier} inside the sandbox (curl)':<40}{fmt(a50, '.2f'):>10}{fmt(a99, '.2f'):>10}")
    for tier, p50, p99, a50, a99 in rows:
        prefix = "" if tier == "native" else f"{tier}_"
        print(f"RATIO {prefix}preview_vs_inside_p50 {p50 / a50:.2f} (preview {p50:.2f} ms / "
              f"inside {a50:.2f} ms, n={N})")
        print(f"RATIO {prefix}preview_vs_inside_p99 {p99 / a99:.2f} (preview {p99:.2f} ms / "
              f"inside {a99:.2f} ms, n={N})")
    against_baseline("previews", figures_of(ratios=ratios, extra=extra))


if __name__ == "__main__":
    main()
