#!/usr/bin/python3
"""DNS for every program, beside its anchors measured in the same run.

Started by bench/dns.sh. It starts a threaded HTTP server on a free port of the host's
127.0.0.1 serving a 1 KiB file (killed by its PID at the end), then one native `kennel run`
with `--allow-net app.test:PORT --resolve app.test:127.0.0.1` of a Python probe that, in
rounds of 20 alternating which goes first, times with `time.perf_counter`:

- `getaddrinfo("app.test", PORT)` (glibc asks the sandbox's resolver at 127.0.0.1:53, which
  answers with the name's synthetic address) against `getaddrinfo("localhost", PORT)` (found
  in /etc/hosts: glibc's own cost of a lookup, with no query);
- a GET of the file with `http.client` on a new connection to `app.test:PORT` (its lookup, then
  the synthetic address's listener, which is the proxy's: no proxy variable is read) against
  the same GET on a new connection to the proxy the variables name (127.0.0.1:3128, an
  absolute-URI request; the proxy resolves the pinned name itself).

RATIO resolve_vs_hosts_p50 (and _p99) is the resolver's lookup over /etc/hosts';
RATIO direct_vs_proxy_p50 (and _p99) is the synthetic address's GET over the proxy's.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import against_baseline, figures_of, fmt, percentile  # noqa: E402

N = int(os.environ.get("BENCH_N", "1000"))
ROUND = 20

SERVER = r"""
import http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                      lambda *a: H(*a, directory=sys.argv[1]))
srv.daemon_threads = True
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""

PROBE = r"""
import http.client, json, socket, sys, time
n, rnd, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def lookup(name):
    t = time.perf_counter()
    socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)
    return time.perf_counter() - t
def get(host, hport, target):
    t = time.perf_counter()
    c = http.client.HTTPConnection(host, hport, timeout=20)
    c.request("GET", target, headers={"Host": f"app.test:{port}"})
    body = c.getresponse().read()
    c.close()
    assert len(body) == 1024, body
    return time.perf_counter() - t
kinds = {
    "resolve": lambda: lookup("app.test"),
    "hosts": lambda: lookup("localhost"),
    "direct": lambda: get("app.test", port, "/file"),
    "proxy": lambda: get("127.0.0.1", 3128, f"http://app.test:{port}/file"),
}
assert socket.getaddrinfo("app.test", port, socket.AF_INET)[0][4][0].startswith("198.18.")
out = {k: [] for k in kinds}
for pair in (("resolve", "hosts"), ("direct", "proxy")):
    for i in range(0, n, rnd):
        k = min(rnd, n - i)
        order = pair if (i // rnd) % 2 == 0 else pair[::-1]
        for name in order:
            out[name] += [kinds[name]() for _ in range(k)]
print(json.dumps(out))
"""


def say(*parts):
    print("dns:", *parts, file=sys.stderr, flush=True)


def measure(kennel):
    """The probe's samples (seconds), by kind, from one native run."""
    www = tempfile.mkdtemp(prefix="kennel-bench-dns-")
    server = None
    try:
        with open(os.path.join(www, "file"), "wb") as f:
            f.write(b"x" * 1024)
        server = subprocess.Popen([sys.executable, "-c", SERVER, www], stdout=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, text=True)
        port = int(server.stdout.readline())
        say(f"server (pid {server.pid}) on 127.0.0.1:{port}; {N} of each kind")
        # No proxy variable reaches the probe unless it connects to the proxy by hand.
        argv = [kennel, "run", "--json", "--timeout", "600s",
                "--allow-net", f"app.test:{port}", "--resolve", "app.test:127.0.0.1", "--",
                "/usr/bin/env", "-u", "HTTP_PROXY", "-u", "http_proxy", "-u", "HTTPS_PROXY",
                "-u", "https_proxy", "-u", "ALL_PROXY", "-u", "all_proxy",
                "/usr/bin/python3", "-c", PROBE, str(N), str(ROUND), str(port)]
        r = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
        if r.get("exit_code") != 0:
            raise SystemExit(f"dns: the probe failed: {r.get('stderr') or r.get('error')}")
        log = r["network_log"]
        direct = sum(1 for e in log if e["protocol"] == "direct" and e["decision"] == "allowed")
        if direct != N:
            raise SystemExit(f"dns: {direct} direct connections logged, not {N}")
        return json.loads(r["stdout"])
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(www, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kennel", required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    samples = measure(args.kennel)
    ms = {k: (percentile(v, 50) * 1000, percentile(v, 99) * 1000) for k, v in samples.items()}
    ratios = {}
    for name, over, under in (("resolve_vs_hosts", "resolve", "hosts"),
                              ("direct_vs_proxy", "direct", "proxy")):
        ratios[f"{name}_p50"] = ms[over][0] / ms[under][0]
        ratios[f"{name}_p99"] = ms[over][1] / ms[under][1]
    extra = {f"{k}_p50_ms": v[0] for k, v in ms.items()}
    figures = {"rounds": N,
               **{k: {"p50_ms": v[0], "p99_ms": v[1],
                      "samples_ms": [round(x * 1000, 4) for x in samples[k]]}
                  for k, v in ms.items()}}
    if args.json:
        baseline = against_baseline("dns", figures_of(ratios=ratios, extra=extra), show=False)
        print(json.dumps({"figures": figures, "ratios": ratios, "baseline": baseline}, indent=2))
        return
    labels = {"resolve": "getaddrinfo app.test (the resolver)",
              "hosts": "getaddrinfo localhost (/etc/hosts)",
              "direct": "GET via the synthetic address",
              "proxy": "GET via the proxy variables' proxy"}
    print(f"{'native, one sandbox':<42}{'p50 ms':>10}{'p99 ms':>10}")
    for k, label in labels.items():
        print(f"{label:<42}{fmt(ms[k][0], '.3f'):>10}{fmt(ms[k][1], '.3f'):>10}")
    for name, over, under in (("resolve_vs_hosts", "resolve", "hosts"),
                              ("direct_vs_proxy", "direct", "proxy")):
        for q, i in (("p50", 0), ("p99", 1)):
            print(f"RATIO {name}_{q} {ms[over][i] / ms[under][i]:.2f} ({over} {ms[over][i]:.3f} "
                  f"ms / {under} {ms[under][i]:.3f} ms, n={N})")
    against_baseline("dns", figures_of(ratios=ratios, extra=extra))


if __name__ == "__main__":
    main()
