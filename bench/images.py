#!/usr/bin/python3
"""Image benchmark for `kennel serve`: an image's warm pool, sustained, against cold runs.

Normally started by bench/images.sh, which builds Kennel, makes sure the image is in the
store, starts a server with a pool of the image and stops it afterwards. Stdlib only
(http.client and threading); run it with the system interpreter (/usr/bin/python3), not a
pyenv shim.

Every HTTP figure is the wall-clock time from "about to send the request" to "whole response
body read" (time.perf_counter), on a connection opened just before. The sustained phase is
open-loop: request i is sent at start + i/rate by a thread of its own on a connection of its
own, whatever happened to the earlier ones. The `kennel run` anchor is timed like
bench/startup.py: perf_counter around subprocess.run, stdio on /dev/null.
"""

import argparse
import gc
import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Client, against_baseline, busy_fraction, figures_of, check_argv, check_targets, cpu_ticks, differences, fmt,  # noqa: E402
                     loadavg, pct, print_overheads, print_targets, run_argv, run_ok, summary,
                     wait_pool_full)

CODE = "import pandas, numpy, matplotlib.pyplot; print(1)"  # prints harness.EXPECTED_STDOUT

# (name, target, direction): the targets set for a pooled run of the image, sustained.
TARGETS = [
    ("pool_p50_ms", 25.0, "<="),
    ("pool_p99_ms", 60.0, "<="),
]

# (name, numerator, denominator): ratios of p50s. No target was set for them.
RATIOS = [
    ("pool_p50_vs_cold_p50", "pool", "cold"),
    ("pool_p50_vs_cold_cli_p50", "pool", "cold_cli"),
]

# (name, minuend, subtrahend): differences of p50s in ms.
OVERHEADS = [
    ("pool_minus_pool_settled", "pool", "pool_settled"),
    ("cold_minus_cold_cli", "cold", "cold_cli"),
]

log = sys.stderr


def say(*parts):
    print("images:", *parts, file=log, flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def proc_cpu_s(pid):
    """CPU seconds (user + system, all threads) the process `pid` has used so far."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- HTTP ---------------------------------------------------------------------------------


def pool_full(client, args):
    """Seconds until the pool of the image is full again (an image's sandbox starts slowly)."""
    return wait_pool_full(client, args.pool, args.image, limit=300.0)


def hits_misses(m):
    return m.get("kennel_pool_hits_total", 0), m.get("kennel_pool_misses_total", 0)


def server_mean_ms(m0, m1):
    """The server's own mean time per run between two /metrics reads, in ms: from the
    kennel_run_duration_seconds histogram, which times a run from taking a sandbox (or
    starting one) to its result, HTTP and JSON excluded."""
    n = m1.get("kennel_run_duration_seconds_count", 0) - m0.get("kennel_run_duration_seconds_count", 0)
    total = m1.get("kennel_run_duration_seconds_sum", 0) - m0.get("kennel_run_duration_seconds_sum", 0)
    return total / n * 1000.0 if n else None


# --- Measurements -------------------------------------------------------------------------


def http_run(client, body):
    """(ok, seconds, result) of one run; the connection is closed afterwards."""
    try:
        client.connect()
        status, payload, dt = client.request("POST", "/v1/runs", body)
    except (OSError, http.client.HTTPException):
        return False, None, None
    finally:
        client.close()
    ok, result = run_ok(status, payload)
    return ok, dt, result


class Monitor(threading.Thread):
    """Polls /healthz every `every` s on a connection of its own: how many warm sandboxes of
    the image were ready, over time."""

    def __init__(self, host, port, image, every=0.1):
        super().__init__(daemon=True)
        self.client = Client(host, port, timeout=10.0)
        self.image, self.every = image, every
        self.samples = []  # (seconds since start, ready)
        self.stop = threading.Event()

    def run(self):
        t0 = time.perf_counter()
        while not self.stop.is_set():
            try:
                ready = self.client.pool_ready(self.image)
            except (OSError, http.client.HTTPException, RuntimeError, ValueError, KeyError):
                ready = None
            self.samples.append((time.perf_counter() - t0, ready))
            self.stop.wait(self.every)
        self.client.close()


def sustained(host, port, control, args, body):
    """Open loop: one pooled run every 1/rate s for `duration` s, each sent on schedule by its
    own thread on its own connection."""
    count = int(round(args.rate * args.duration))
    interval = 1.0 / args.rate
    records = [None] * count
    inflight = {"now": 0, "max": 0}
    lock = threading.Lock()

    def one(i, due):
        c = Client(host, port)
        rec = {"i": i, "ok": False, "status": None, "error": None}
        with lock:
            inflight["now"] += 1
            inflight["max"] = max(inflight["max"], inflight["now"])
        try:
            c.connect()
            rec["lag_ms"] = (time.perf_counter() - due) * 1000.0
            status, payload, dt = c.request("POST", "/v1/runs", body)
            rec["status"] = status
            rec["latency_ms"] = dt * 1000.0
            rec["done_unix_ms"] = time.time() * 1000.0
            ok, result = run_ok(status, payload)
            rec["ok"] = ok
            if result is not None:
                rec["code_ms"] = result.get("duration_ms")
                rec["sandbox_cpu_ms"] = result.get("cpu_ms")
            if not ok:
                rec["error"] = f"HTTP {status}: {payload[:200]!r}"
        except (OSError, http.client.HTTPException) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            c.close()
            with lock:
                inflight["now"] -= 1
            rec["done_s"] = time.perf_counter() - t_start
            records[i] = rec

    mon = Monitor(host, port, args.image)
    m0 = control.metrics()
    cpu0, self0, srv0 = cpu_ticks(), os.times(), proc_cpu_s(args.server_pid)
    mon.start()
    threads = []
    t_start = time.perf_counter() + 0.05
    unix0 = time.time() + 0.05
    for i in range(count):
        due = t_start + i * interval
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(i, due), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    unix1 = time.time()
    mon.stop.set()
    mon.join()
    cpu1, self1, srv1 = cpu_ticks(), os.times(), proc_cpu_s(args.server_pid)
    m1 = control.metrics()

    lat = [r["latency_ms"] for r in records if r["ok"]]
    errors = [r for r in records if not r["ok"]]
    h0, x0 = hits_misses(m0)
    h1, x1 = hits_misses(m1)
    ready = [r for _, r in mon.samples if r is not None]
    return {
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "sent": count,
        "ok": len(lat),
        "errors": len(errors),
        "error_examples": [r["error"] for r in errors[:5]],
        "wall_s": wall,
        "latency": summary(lat),
        "send_lag_ms": summary([r["lag_ms"] for r in records if r.get("lag_ms") is not None]),
        "max_in_flight": inflight["max"],
        "pool_hits": int(h1 - h0),
        "pool_misses": int(x1 - x0),
        "server_mean_ms": server_mean_ms(m0, m1),
        "pool_ready": {
            "samples": len(ready),
            "every_s": mon.every,
            "mean": statistics.fmean(ready) if ready else None,
            "min": min(ready) if ready else None,
            "empty_fraction": sum(1 for r in ready if r == 0) / len(ready) if ready else None,
            "series": mon.samples,
        },
        "host_cpu_busy": busy_fraction(cpu0, cpu1),
        # The server process itself (not its sandboxes), as a fraction of all CPUs.
        "server_cpu": ((srv1 - srv0) / (self1.elapsed - self0.elapsed) / (os.cpu_count() or 1)
                       if srv0 is not None and srv1 is not None and self1.elapsed > self0.elapsed
                       else None),
        # The sandboxes of the runs answered in the phase: the sum of their cpu_ms (a warm
        # one's includes its start and preloads), as a fraction of all CPUs over the phase.
        "sandbox_cpu": (sum(r.get("sandbox_cpu_ms") or 0 for r in records) / 1000.0 / wall
                        / (os.cpu_count() or 1)),
        "client_cpu": ((self1.user + self1.system - self0.user - self0.system)
                       / ((self1.elapsed - self0.elapsed) * (os.cpu_count() or 1))
                       if self1.elapsed > self0.elapsed else None),
        "window_unix_ms": [unix0 * 1000.0, unix1 * 1000.0],
        "records": records,
    }


def settled(control, args, body):
    """Sequential pooled runs, each on a full pool that has had `pause` s to settle: what a
    warm hand-out costs with no load but its own (the one refill it wakes)."""
    lat, code, cpu, refill, hits = [], [], [], [], 0
    failed = 0
    m0 = control.metrics()
    for _ in range(args.n):
        pool_full(control, args)
        time.sleep(args.pause)
        h0, _ = hits_misses(control.metrics())
        ok, dt, result = http_run(Client(control.host, control.port), body)
        h1, _ = hits_misses(control.metrics())
        hits += int(h1 - h0 == 1)
        refill.append(pool_full(control, args) * 1000.0)
        if ok:
            lat.append(dt * 1000.0)
            code.append(result.get("duration_ms", 0))
            cpu.append(result.get("cpu_ms", 0))
        else:
            failed += 1
    return {"samples": lat, "failed": failed, "hits": hits, "code_ms": code, "sandbox_cpu_ms": cpu,
            "refill_ms": refill, "server_mean_ms": server_mean_ms(m0, control.metrics())}


def cold(control, args, body, cli_argv):
    """Cold runs through the server and cold `kennel run`s, round by round (the first variant
    rotating), the pool full and idle, so no refill competes with them."""
    pool_full(control, args)
    time.sleep(args.pause)
    m0 = control.metrics()
    h0, x0 = hits_misses(m0)
    variants = {"cold": lambda: http_run(Client(control.host, control.port), body)}
    if cli_argv:
        variants["cold_cli"] = lambda: (lambda dt, rc: (rc == 0, dt, None))(*run_argv(cli_argv))
    wanted = {"cold": args.cold_n, "cold_cli": args.cli_n}
    samples = {name: [] for name in variants}
    failed = {name: 0 for name in variants}
    sandbox_ms, cpu_ms = [], []
    names = list(variants)
    for i in range(max(wanted[n] for n in names)):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            if len(samples[name]) + failed[name] >= wanted[name]:
                continue
            ok, dt, result = variants[name]()
            if ok:
                samples[name].append(dt * 1000.0)
                if result is not None:
                    sandbox_ms.append(result.get("duration_ms", 0))
                    cpu_ms.append(result.get("cpu_ms", 0))
            else:
                failed[name] += 1
    m1 = control.metrics()
    h1, x1 = hits_misses(m1)
    return {"samples": samples, "failed": failed, "sandbox_ms": sandbox_ms, "sandbox_cpu_ms": cpu_ms,
            "pool_hits": int(h1 - h0), "pool_misses": int(x1 - x0),
            "server_mean_ms": server_mean_ms(m0, m1)}


def match_audit(path, records):
    """Marks each answered record of the sustained phase `pooled` True or False from the
    server's audit line for it: the latest unclaimed line written at most 100 ms before the
    answer arrived (the server writes it just before it answers). The line's duration_ms is
    the run's own (the result's), not the server's."""
    if not path:
        return 0
    try:
        with open(path) as f:
            entries = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return 0
    entries = sorted((e["at_unix_ms"], i, e) for i, e in enumerate(entries) if e.get("kind") == "run")
    claimed, matched = set(), 0
    for rec in sorted((r for r in records if r.get("done_unix_ms")), key=lambda r: r["done_unix_ms"]):
        best = None
        for at, i, e in entries:
            if at > rec["done_unix_ms"] + 1:
                break
            if i not in claimed and rec["done_unix_ms"] - at <= 100:
                best = (i, e)
        if best:
            claimed.add(best[0])
            rec["pooled"] = bool(best[1].get("pooled"))
            matched += 1
    return matched


# --- Main ---------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env = os.environ.get
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    ap.add_argument("--url", required=True, help="the server, such as http://127.0.0.1:8080")
    ap.add_argument("--server-pid", type=int, help="the server's pid, for its own CPU use (omit to skip)")
    ap.add_argument("--image", default="python-data", help="the pooled image")
    ap.add_argument("--pool", type=int, default=int(env("BENCH_POOL", "2")),
                    help="the server's [pool] images size for the image (what 'full' means)")
    ap.add_argument("--kennel", default=env("KENNEL"), help="kennel binary for the cold CLI anchor")
    ap.add_argument("--audit-log", help="the server's audit log, for its own time per run")
    ap.add_argument("--rate", type=float, default=float(env("BENCH_RATE", "2")),
                    help="pooled runs per second, sustained")
    ap.add_argument("--duration", type=float, default=float(env("BENCH_DURATION", "60")),
                    help="seconds of sustained pooled runs")
    ap.add_argument("-n", type=int, default=int(env("BENCH_N", "10")),
                    help="sequential pooled runs on a full, settled pool")
    ap.add_argument("--cold-n", type=int, default=int(env("BENCH_COLD_N", "10")),
                    help="cold runs through the server")
    ap.add_argument("--cli-n", type=int, default=int(env("BENCH_CLI_N", "5")), help="cold `kennel run`s")
    ap.add_argument("--pause", type=float, default=float(env("BENCH_PAUSE", "1")),
                    help="seconds to wait after the pool is full again, before measuring")
    args = ap.parse_args()
    if args.pool < 1 or args.rate <= 0 or args.duration <= 0 or args.cold_n < 1 or args.n < 0 or args.cli_n < 0:
        ap.error("pool, rate, duration and cold-n must be positive; n and cli-n at least 0")

    url = urllib.parse.urlsplit(args.url)
    host, port = url.hostname, url.port or 80
    control = Client(host, port)
    t_begin = time.perf_counter()
    pooled_body = {"language": "python", "code": CODE, "image": args.image}
    # 1G differs from the server's default memory, so the pool cannot serve it: always cold.
    cold_body = dict(pooled_body, limits={"memory": "1G"})

    # The pool is full before anything is timed; a pooled and a cold run work (and warm the
    # page cache for the image's files); the CLI works, or its anchor is skipped.
    say(f"waiting for {args.pool} warm sandboxes of {args.image}")
    warm_s = pool_full(control, args)
    for what, body in (("pooled", pooled_body), ("cold", cold_body)):
        pool_full(control, args)
        ok, _, result = http_run(Client(host, port), body)
        if not ok:
            say(f"the server cannot run the code {what} on {args.image}: {str(result)[:300]}")
            return 2
    cli_argv = ([args.kennel, "run", "--image", args.image, "--", "python3", "-c", CODE]
                if args.kennel else None)
    skipped = {}
    if args.cli_n == 0:
        skipped["cold_cli"] = "BENCH_CLI_N=0"
        cli_argv = None
    elif not cli_argv:
        skipped["cold_cli"] = "no --kennel binary given"
    elif why := check_argv(cli_argv):
        skipped["cold_cli"] = why
        cli_argv = None
    for name, why in skipped.items():
        say(f"skipping {name}: {why}")
    pool_full(control, args)
    # One quiet second with the pool full: lets the last refill settle, and shows how busy the
    # host is without us (other tenants of a shared machine).
    cpu0 = cpu_ticks()
    time.sleep(max(args.pause, 1.0))
    idle_busy = busy_fraction(cpu0, cpu_ticks())
    load_before = loadavg()
    # The floor under every HTTP figure: GET /healthz, timed the same way (fresh connection,
    # opened untimed), 20 times.
    floor = []
    for _ in range(20):
        c = Client(host, port)
        c.connect()
        status, _, dt = c.request("GET", "/healthz")
        c.close()
        if status == 200:
            floor.append(dt * 1000.0)

    gc.disable()
    say(f"sustained: {args.rate:g} pooled runs/s for {args.duration:g} s, open loop")
    sus = sustained(host, port, control, args, pooled_body)
    gc.enable()
    gc.collect()
    gc.disable()
    say(f"refilling the pool, then {args.n} sequential pooled runs on a full, settled pool")
    t0 = time.perf_counter()
    pool_full(control, args)
    refill_after_s = time.perf_counter() - t0
    sett = settled(control, args, pooled_body) if args.n else None
    say(f"cold: {args.cold_n} runs through the server" + (f", {args.cli_n} kennel runs" if cli_argv else ""))
    cld = cold(control, args, cold_body, cli_argv)
    gc.enable()
    load_after = loadavg()

    matched = match_audit(args.audit_log, sus["records"])
    warm = [r["latency_ms"] for r in sus["records"] if r["ok"] and r.get("pooled") is True]
    missed = [r["latency_ms"] for r in sus["records"] if r["ok"] and r.get("pooled") is False]
    latency = {
        "pool": sus["latency"],
        "pool_warm": summary(warm),
        "pool_missed": summary(missed),
        "pool_settled": summary(sett["samples"]) if sett else None,
        "cold": summary(cld["samples"]["cold"]),
        "cold_cli": summary(cld["samples"].get("cold_cli", [])),
    }
    failures = {"pool": sus["errors"], "pool_warm": 0, "pool_missed": 0, "pool_settled": sett["failed"] if sett else 0,
                "cold": cld["failed"]["cold"], "cold_cli": cld["failed"].get("cold_cli", 0)}
    for name, s in latency.items():
        if s is not None:
            s["failed"] = failures[name]
    if latency["cold"] is None:
        say(f"every cold run failed ({cld['failed']['cold']}); nothing to compare the pool with")
        return 2

    def p50(name):
        return latency[name]["p50_ms"] if latency.get(name) else None

    pool = latency["pool"] or {}
    values = {"pool_p50_ms": pool.get("p50_ms"), "pool_p99_ms": pool.get("p99_ms")}
    targets = check_targets(TARGETS, values)
    ratios = {name: (p50(a) / p50(b) if p50(a) is not None and p50(b) else None) for name, a, b in RATIOS}
    overheads = differences(OVERHEADS, p50)

    # Where the time goes: the client's wait, the server's own mean time per run (its
    # histogram), and the code's time inside the sandbox (the result's duration_ms).
    ncpu = os.cpu_count() or 1
    recs = [r for r in sus["records"] if r["ok"]]
    warm_recs = [r for r in recs if r.get("pooled") is True]
    missed_recs = [r for r in recs if r.get("pooled") is False]
    # A pooled run's cpu_ms is all its sandbox ever used: the start and the preloads, which
    # the refill paid, and the run. On a settled pool nothing competes with it.
    cpu_per_sandbox = median(sett["sandbox_cpu_ms"]) if sett else median(
        [r["sandbox_cpu_ms"] for r in warm_recs if r.get("sandbox_cpu_ms") is not None])
    cpu_per_miss = median([r["sandbox_cpu_ms"] for r in missed_recs if r.get("sandbox_cpu_ms") is not None])
    breakdown = {
        "http_floor": summary(floor),
        "pool": {
            "client_p50_ms": p50("pool"),
            "server_mean_ms": sus["server_mean_ms"],
            "warm_client_p50_ms": p50("pool_warm"),
            "warm_code_p50_ms": median([r["code_ms"] for r in warm_recs if r.get("code_ms") is not None]),
            "missed_client_p50_ms": p50("pool_missed"),
            "missed_sandbox_p50_ms": median([r["code_ms"] for r in missed_recs if r.get("code_ms") is not None]),
            "missed_sandbox_cpu_p50_ms": cpu_per_miss,
        },
        "pool_settled": sett and {
            "client_p50_ms": p50("pool_settled"),
            "client_mean_ms": statistics.fmean(sett["samples"]) if sett["samples"] else None,
            "server_mean_ms": sett["server_mean_ms"],
            "code_p50_ms": median(sett["code_ms"]),
        },
        "cold": {
            "client_p50_ms": p50("cold"),
            "client_mean_ms": latency["cold"]["mean_ms"],
            "server_mean_ms": cld["server_mean_ms"],
            "sandbox_p50_ms": median(cld["sandbox_ms"]),
            "sandbox_cpu_p50_ms": median(cld["sandbox_cpu_ms"]),
        },
        # What the pool costs the machine: every pooled run ends its sandbox, and the refill
        # starts another, preloads imported (the pooled run's cpu_ms is all that sandbox's CPU).
        "refill": {
            "sandbox_cpu_p50_ms": cpu_per_sandbox,
            "wall_p50_ms": median(sett["refill_ms"]) if sett else None,
            "cpu_share_at_rate": (cpu_per_sandbox / 1000.0 * args.rate / ncpu) if cpu_per_sandbox else None,
            # The most pooled runs per second the machine's CPUs could refill, were they idle.
            "max_rate_per_s": (ncpu / (cpu_per_sandbox / 1000.0)) if cpu_per_sandbox else None,
            # ... and one start at a time, as the refill runs when a single sandbox is missing.
            "serial_rate_per_s": (1000.0 / median(sett["refill_ms"])) if sett and sett["refill_ms"] else None,
        },
    }

    result = {
        "url": args.url,
        "server_pid": args.server_pid,
        "image": args.image,
        "code": CODE,
        "pool_size": args.pool,
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "n_settled": args.n,
        "cold_n": args.cold_n,
        "cli_n": args.cli_n,
        "pause_s": args.pause,
        "method": "perf_counter around one HTTP request on a fresh connection (opened untimed); "
                  "sustained phase open-loop, one thread and connection per request; "
                  "cold CLI as bench/startup.py (subprocess.run, stdio to /dev/null)",
        "host": {"nproc": ncpu, "loadavg_before": load_before, "loadavg_after": load_after,
                 "idle_cpu_busy": idle_busy, "kernel": os.uname().release},
        "elapsed_s": time.perf_counter() - t_begin,
        "pool_warmup_s": warm_s,
        "refill_after_sustained_s": refill_after_s,
        "latency": latency,
        "skipped": skipped,
        "sustained": {k: v for k, v in sus.items() if k != "records"},
        "sustained_audit_matched": matched,
        "settled": sett and {"pool_hits": sett["hits"], "runs": args.n},
        "cold_phase_pool_hits": cld["pool_hits"],
        "cold_phase_pool_misses": cld["pool_misses"],
        "breakdown": breakdown,
        "overhead_ms": overheads,
        "ratios": ratios,
        "targets": targets,
        "samples_ms": {
            "pool": [round(r["latency_ms"], 3) if r["ok"] else None for r in sus["records"]],
            "pool_served_warm": [r.get("pooled") for r in sus["records"]],
            "pool_send_lag": [round(r["lag_ms"], 3) if r.get("lag_ms") is not None else None
                              for r in sus["records"]],
            "pool_code": [r.get("code_ms") for r in sus["records"]],
            "pool_sandbox_cpu": [r.get("sandbox_cpu_ms") for r in sus["records"]],
            "pool_settled": [round(x, 3) for x in sett["samples"]] if sett else [],
            "pool_settled_sandbox_cpu": sett["sandbox_cpu_ms"] if sett else [],
            "http_floor_healthz": [round(x, 3) for x in floor],
            "pool_settled_refill": [round(x, 3) for x in sett["refill_ms"]] if sett else [],
            "cold": [round(x, 3) for x in cld["samples"]["cold"]],
            "cold_cli": [round(x, 3) for x in cld["samples"].get("cold_cli", [])],
        },
    }

    figures = figures_of(overheads=overheads, ratios=ratios, targets=targets)
    if args.json:
        result["baseline"] = against_baseline("images", figures, show=False)
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0

    la = lambda l: l[0] if l else "?"
    print(f"kennel serve, the warm pool of {args.image} (size {args.pool}) against cold runs "
          f"({ncpu} CPUs, load {la(load_before)} -> {la(load_after)}, CPU {fmt(pct(idle_busy), '.0f')}% "
          f"busy while idle, {result['elapsed_s']:.0f} s)")
    print(f"code: {CODE}")
    print()
    print(f"{'variant':<13} {'p50 ms':>9} {'p99 ms':>9} {'min ms':>9} {'max ms':>9} {'runs':>5} "
          f"{'failed':>6}  what")
    what = {
        "pool": f"POST /v1/runs image {args.image}, {args.rate:g}/s open loop for {args.duration:g} s",
        "pool_warm": "  of these, the ones the pool served (the audit log's pooled: true)",
        "pool_missed": "  of these, the ones it missed (started cold, no preloads)",
        "pool_settled": "the same one at a time, pool full and settled before each",
        "cold": 'the same with "limits":{"memory":"1G"}, one at a time (misses the pool)',
        "cold_cli": f"kennel run --image {args.image} -- python3 -c '...'",
    }
    for name in ["pool", "pool_warm", "pool_missed", "pool_settled", "cold", "cold_cli"]:
        s = latency.get(name)
        if s is None and name in ("pool_warm", "pool_missed"):
            print(f"{name:<13} {'-':>9}  {what[name].strip()}: none")
            continue
        if s is None:
            why = skipped.get(name, "BENCH_N=0" if name == "pool_settled" and not args.n
                              else f"all {failures.get(name, 0)} runs failed")
            print(f"{name:<13} {'skipped':>9}  {why}")
            continue
        print(f"{name:<13} {s['p50_ms']:>9.2f} {s['p99_ms']:>9.2f} {s['min_ms']:>9.2f} {s['max_ms']:>9.2f} "
              f"{s['runs']:>5} {s['failed']:>6}  {what[name]}")
    print()
    pr = sus["pool_ready"]
    served = sus["pool_hits"] + sus["pool_misses"]
    print(f"sustained: {sus['ok']}/{sus['sent']} ok in {sus['wall_s']:.1f} s; served warm "
          f"{sus['pool_hits']}/{served} (kennel_pool_hits_total), cold {sus['pool_misses']}; "
          f"at most {sus['max_in_flight']} in flight; send lag p99 "
          f"{fmt(sus['send_lag_ms'] and sus['send_lag_ms']['p99_ms'])} ms")
    print(f"  pool ready (/healthz every {pr['every_s']:g} s): mean {fmt(pr['mean'], '.2f')}, "
          f"min {pr['min']}, empty {fmt(pct(pr['empty_fraction']), '.0f')}% of the time; "
          f"full again {refill_after_s:.1f} s after the last answer")
    for e in sus["error_examples"]:
        print(f"  error: {e}")
    if sett:
        print(f"settled: pool hits {sett['hits']}/{args.n}; the pool full again "
              f"{fmt(breakdown['refill']['wall_p50_ms'], '.0f')} ms (p50) after a pooled run's answer")
    print(f"cold: pool hits {cld['pool_hits']} (should be 0), misses {cld['pool_misses']}")
    print()
    print("where the time goes (p50s)")
    f = breakdown["http_floor"]
    print(f"  HTTP floor: GET /healthz {fmt(f and f['p50_ms'])} ms on a fresh connection, timed the same way")
    b = breakdown["pool"]
    print(f"  pool, sustained: the server's own time {fmt(b['server_mean_ms'], '.1f')} ms (mean per run, "
          f"kennel_run_duration_seconds, warm and missed together)")
    if b["warm_client_p50_ms"] is not None:
        print(f"    served warm: client {fmt(b['warm_client_p50_ms'], '.1f')} ms, of which the code in the warm "
              f"interpreter {fmt(b['warm_code_p50_ms'], '.0f')} ms (the result's duration_ms)")
    if b["missed_client_p50_ms"] is not None:
        print(f"    missed: client {fmt(b['missed_client_p50_ms'], '.0f')} ms; sandbox start to exit "
              f"{fmt(b['missed_sandbox_p50_ms'], '.0f')} ms using {fmt(b['missed_sandbox_cpu_p50_ms'], '.0f')} ms CPU")
    if sett:
        b = breakdown["pool_settled"]
        print(f"  pool, settled: client {fmt(b['client_p50_ms'], '.1f')} ms (mean {fmt(b['client_mean_ms'], '.1f')}), "
              f"the server's own time {fmt(b['server_mean_ms'], '.1f')} ms (mean, kennel_run_duration_seconds), "
              f"the code {fmt(b['code_p50_ms'], '.0f')} ms")
    b = breakdown["cold"]
    print(f"  cold: client {fmt(b['client_p50_ms'], '.0f')} ms (mean {fmt(b['client_mean_ms'], '.0f')}), the "
          f"server's own time {fmt(b['server_mean_ms'], '.0f')} ms (mean), sandbox start to exit "
          f"{fmt(b['sandbox_p50_ms'], '.0f')} ms using {fmt(b['sandbox_cpu_p50_ms'], '.0f')} ms CPU")
    b = breakdown["refill"]
    print(f"  refill: a warm sandbox of {args.image} costs {fmt(b['sandbox_cpu_p50_ms'], '.0f')} ms CPU "
          f"(start, preloads and run: a settled pooled run's cpu_ms) and {fmt(b['wall_p50_ms'], '.0f')} ms "
          f"wall; at {args.rate:g} runs/s that is {fmt(pct(b['cpu_share_at_rate']), '.0f')}% of {ncpu} CPUs "
          f"(at most {fmt(b['max_rate_per_s'], '.1f')} refills/s on idle CPUs, "
          f"{fmt(b['serial_rate_per_s'], '.1f')}/s one at a time); warm runs served "
          f"{sus['pool_hits'] / sus['wall_s']:.2f}/s in the sustained phase")
    print(f"  CPU during the sustained phase: host {fmt(pct(sus['host_cpu_busy']), '.0f')}% busy, "
          f"the sandboxes of its runs {fmt(pct(sus['sandbox_cpu']), '.0f')}% (their cpu_ms summed), "
          f"the server process {fmt(pct(sus['server_cpu']), '.0f')}%, this client "
          f"{fmt(pct(sus['client_cpu']), '.0f')}% (of all CPUs)")
    print()
    print_overheads(overheads)
    for name, v in ratios.items():
        print(f"RATIO {name} {fmt(v, '.4f')}")
    print_targets(targets)
    print()
    against_baseline("images", figures)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError, http.client.HTTPException) as exc:
        say(f"cannot measure: {exc}")
        sys.exit(2)
