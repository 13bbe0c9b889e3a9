#!/usr/bin/python3
"""Proxy throughput benchmark: a bulk download over loopback, directly vs through Kennel's proxy.

Stdlib only; run it with the system interpreter (/usr/bin/python3), as root (network mode
"allow" binds the proxy inside the sandbox's network namespace).

One run starts a tiny threaded HTTP server on a free port of the host's 127.0.0.1 that answers
every GET with the same in-memory buffer written over and over (256 MiB by default), then
downloads it with curl, interleaved round by round:

  direct        curl on the host, straight to 127.0.0.1:PORT
  proxy_connect curl inside `kennel run --allow-net bulk.test:PORT --resolve bulk.test:127.0.0.1`,
                with -p (--proxytunnel), so the bytes go through an HTTP CONNECT tunnel
  proxy_http    the same without -p: curl sends an absolute-URI request to the plain-HTTP proxy

Throughput is curl's own `size_download / time_total`, so Kennel's start-up is not counted;
MB/s means 10^6 bytes per second. A sample counts only when curl got every byte (and, through
Kennel, the network_log entry counted at least that many bytes down). The output ends with
`RATIO proxy_vs_direct_throughput VALUE` (median CONNECT throughput / median direct one).
"""

import argparse
import json
import os
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import against_baseline, figures_of, loadavg  # noqa: E402

PY = "/usr/bin/python3"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_KENNEL = os.path.join(ROOT, "target", "release", "kennel")
CHUNK = 1 << 20


def say(msg):
    print(f"proxy.py: {msg}", file=sys.stderr, flush=True)


def stale(path):
    """Whether `path` is missing or older than any source that goes into it."""
    if not os.path.exists(path):
        return True
    built = os.path.getmtime(path)
    roots = [os.path.join(ROOT, "Cargo.toml"), os.path.join(ROOT, "Cargo.lock")]
    crates = os.path.join(ROOT, "crates")
    for c in os.listdir(crates) if os.path.isdir(crates) else []:
        roots += [os.path.join(crates, c, n) for n in ("Cargo.toml", "build.rs", "src")]
    for r in roots:
        if os.path.isfile(r) and os.path.getmtime(r) > built:
            return True
        for d, _, files in os.walk(r) if os.path.isdir(r) else []:
            if any(os.path.getmtime(os.path.join(d, f)) > built for f in files):
                return True
    return False


def kennel_binary(path):
    if path != DEFAULT_KENNEL:
        if not os.path.exists(path):
            say(f"KENNEL={path} does not exist")
            sys.exit(2)
        return path
    if stale(path):
        say("building kennel (cargo build --release -p kennel -p kennel-sandbox)")
        r = subprocess.run(["cargo", "build", "--release", "-p", "kennel", "-p", "kennel-sandbox"], cwd=ROOT,
                           stdout=sys.stderr)
        if r.returncode != 0:
            say("the build failed")
            sys.exit(2)
    return path


class Bulk(socketserver.ThreadingTCPServer):
    """Answers any request with `total` bytes: the same buffer, written again and again."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, total):
        self.total = total
        self.buf = memoryview(bytes(range(256)) * (CHUNK // 256))
        super().__init__(("127.0.0.1", 0), BulkHandler)


class BulkHandler(socketserver.BaseRequestHandler):
    def handle(self):
        s, total, buf = self.request, self.server.total, self.server.buf
        head = b""
        while b"\r\n\r\n" not in head:
            b = s.recv(4096)
            if not b:
                return
            head += b
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % total)
        left = total
        try:
            while left:
                n = min(left, len(buf))
                s.sendall(buf[:n])
                left -= n
            # Close gracefully: FIN, then wait for the client's, so no RST cuts the tail.
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            while s.recv(65536):
                pass
        except OSError:
            pass


def curl_argv(url, tunnel):
    argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{size_download} %{time_total}"]
    return argv + (["-p"] if tunnel else []) + [url]


def parse_curl(out):
    size, secs = out.split()
    return int(size), float(secs)


def run_direct(port, total, timeout):
    p = subprocess.run(curl_argv(f"http://127.0.0.1:{port}/", False) + ["--noproxy", "*"],
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return None, f"curl exit {p.returncode}: {p.stderr.strip()[-200:]}"
    size, secs = parse_curl(p.stdout)
    if size != total:
        return None, f"got {size} of {total} bytes"
    return size / secs, None


def run_kennel(kennel, port, total, timeout, tunnel, cpus):
    argv = [kennel, "run", "--json", "--allow-net", f"bulk.test:{port}",
            "--resolve", "bulk.test:127.0.0.1", "--timeout", f"{timeout}s", "--cpus", str(cpus),
            "--"] + curl_argv(f"http://bulk.test:{port}/", tunnel)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30)
    try:
        r = json.loads(p.stdout)
    except ValueError:
        return None, f"no result (exit {p.returncode}): {p.stderr.strip()[-300:]}"
    if "error" in r:
        return None, f"kennel: {r['error']}"
    if r["exit_code"] != 0:
        return None, f"curl exit {r['exit_code']}: {r['stderr'].strip()[-200:]}"
    size, secs = parse_curl(r["stdout"])
    if size != total:
        return None, f"got {size} of {total} bytes"
    protocol = "connect" if tunnel else "http"
    log = [e for e in r["network_log"] if e["protocol"] == protocol and e["decision"] == "allowed"]
    if len(log) != 1 or log[0]["bytes_down"] < total:
        return None, f"network_log does not count the download: {r['network_log']}"
    return size / secs, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=int(os.environ.get("BENCH_SIZE_MIB", "256")),
                    help="payload size in MiB (default 256)")
    ap.add_argument("-n", type=int, default=int(os.environ.get("BENCH_N", "5")),
                    help="measured rounds (default 5)")
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", "1")),
                    help="unrecorded rounds first (default 1)")
    ap.add_argument("--cpus", type=float, default=1.0,
                    help="--cpus for the sandbox (Kennel's default, 1)")
    ap.add_argument("--kennel", default=os.environ.get("KENNEL", DEFAULT_KENNEL))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.n < 1 or args.size_mib < 1:
        ap.error("-n and --size-mib must be at least 1")
    if os.geteuid() != 0:
        say("needs root: network mode allow binds the proxy inside the sandbox")
        return 2
    kennel = kennel_binary(os.path.abspath(args.kennel))
    total = args.size_mib << 20
    timeout = 120

    server = Bulk(total)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()

    variants = [
        ("direct", lambda: run_direct(port, total, timeout)),
        ("proxy_connect", lambda: run_kennel(kennel, port, total, timeout, True, args.cpus)),
        ("proxy_http", lambda: run_kennel(kennel, port, total, timeout, False, args.cpus)),
    ]
    load_before = loadavg()
    samples = {name: [] for name, _ in variants}
    failures = {name: [] for name, _ in variants}
    try:
        for i in range(args.warmup + args.n):
            # Round-robin, rotating the first variant from round to round.
            for j in range(len(variants)):
                name, fn = variants[(i + j) % len(variants)]
                rate, why = fn()
                if i < args.warmup:
                    if why:
                        say(f"warm-up {name}: {why}")
                    continue
                if why:
                    failures[name].append(why)
                else:
                    samples[name].append(rate / 1e6)
    finally:
        server.shutdown()
        server.server_close()
    load_after = loadavg()

    def med(name):
        return statistics.median(samples[name]) if samples[name] else None

    d, c = med("direct"), med("proxy_connect")
    ratio = c / d if c and d else None
    h = med("proxy_http")
    figures = figures_of(ratios={"proxy_vs_direct_throughput": ratio,
                                 "proxy_http_vs_direct_throughput": h / d if h and d else None},
                         extra={f"{n}_median_mb_per_s": med(n) for n in samples})
    if args.json:
        against_baseline("proxy", figures, show=False)
        print(json.dumps({
            "size_bytes": total, "rounds": args.n, "cpus": args.cpus, "kennel": kennel,
            "mb_per_s": samples, "median_mb_per_s": {n: med(n) for n in samples},
            "failures": failures, "loadavg_before": load_before, "loadavg_after": load_after,
            "ratios": {"proxy_vs_direct_throughput": ratio,
                       "proxy_http_vs_direct_throughput": h / d if h and d else None},
        }, indent=2))
    else:
        print(f"payload {args.size_mib} MiB, {args.n} rounds, sandbox --cpus {args.cpus}, "
              f"{os.cpu_count()} CPUs, load {load_before} -> {load_after}")
        print(f"{'variant':<14} {'median MB/s':>12} {'min':>9} {'max':>9}  failed")
        for name in samples:
            xs = samples[name]
            if xs:
                print(f"{name:<14} {med(name):12.1f} {min(xs):9.1f} {max(xs):9.1f}  {len(failures[name])}")
            else:
                print(f"{name:<14} {'n/a':>12} {'':9} {'':9}  {len(failures[name])}")
        for name, whys in failures.items():
            for why in whys[:3]:
                say(f"{name} failed: {why}")
        print(f"RATIO proxy_vs_direct_throughput {ratio:.3f}" if ratio else
              "RATIO proxy_vs_direct_throughput n/a")
        if h and d:
            print(f"RATIO proxy_http_vs_direct_throughput {h / d:.3f}")
        print()
        against_baseline("proxy", figures)
    return 0 if ratio else 1


if __name__ == "__main__":
    sys.exit(main())
