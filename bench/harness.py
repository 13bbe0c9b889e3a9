"""What the bench scripts share: statistics, host figures, timing a command, and an HTTP client
for `kennel serve`. Stdlib only; imported by bench/*.py, which put their own directory on
sys.path first (they are run as `/usr/bin/python3 bench/X.py`)."""

import http.client
import json
import os
import re
import statistics
import subprocess
import time

EXPECTED_STDOUT = "1\n"


# --- Statistics and formatting ------------------------------------------------------------


def percentile(xs, q):
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(xs):
    """p50/p99/min/max/mean of samples in ms (None when there are none)."""
    if not xs:
        return None
    return {
        "runs": len(xs),
        "p50_ms": statistics.median(xs),
        "p99_ms": percentile(xs, 99),
        "min_ms": min(xs),
        "max_ms": max(xs),
        "mean_ms": statistics.fmean(xs),
    }


def fmt(x, spec=".2f"):
    return "n/a" if x is None else format(x, spec)


def pct(x):
    return None if x is None else x * 100.0


# --- The host -----------------------------------------------------------------------------


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def cpu_ticks():
    """(busy, total) jiffies of the whole host, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_fraction(a, b):
    if a is None or b is None or b[1] == a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


# --- Commands -----------------------------------------------------------------------------


def run_argv(argv):
    """(seconds, exit status) of one run of argv, stdio on /dev/null, timed with perf_counter."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, p.returncode


def check_argv(argv):
    """None when argv prints EXPECTED_STDOUT and exits 0; else why not."""
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
    if p.returncode != 0 or p.stdout != EXPECTED_STDOUT.encode():
        err = p.stderr.decode(errors="replace").strip()
        return f"exit status {p.returncode}, stdout {p.stdout[:40]!r}: {err[-300:] or '(no stderr)'}"
    return None


def children_map():
    """{parent pid: [child pids]} of every process on the host, from /proc/*/stat."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def descendants(root, children=None):
    """Pids of every process below root (by parent pid; `children` from children_map(), read
    afresh when not given)."""
    if children is None:
        children = children_map()
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def proc_kib(pid, name, key):
    """The KiB figure `key` of /proc/PID/NAME (`status`, `smaps_rollup`), None when pid is gone
    or has no such line (a kernel thread, a zombie)."""
    try:
        with open(f"/proc/{pid}/{name}") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def pss_kib(pid):
    """The proportional set size of pid in KiB (/proc/PID/smaps_rollup), None when it is gone
    or has no memory of its own."""
    return proc_kib(pid, "smaps_rollup", "Pss")


def status_kib(pid, key):
    """A KiB figure of /proc/PID/status (`VmRSS`, `VmHWM`), None when pid is gone."""
    return proc_kib(pid, "status", key)


# --- HTTP ---------------------------------------------------------------------------------


class Client:
    """One keep-alive connection. Requests are not retried: a run must not happen twice."""

    def __init__(self, host, port, timeout=120.0):
        self.host, self.port, self.timeout = host, port, timeout
        self.conn = None

    def connect(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.connect()

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, body=None):
        """(status, body bytes, seconds); raises OSError/HTTPException on a broken connection."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        self.connect()
        t0 = time.perf_counter()
        try:
            self.conn.request(method, path, body=data, headers=headers)
            r = self.conn.getresponse()
            payload = r.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        dt = time.perf_counter() - t0
        if (r.getheader("Connection") or "").lower() == "close":
            self.close()
        return r.status, payload, dt

    def json(self, method, path, body=None, want=(200,)):
        status, payload, dt = self.request(method, path, body)
        if status not in want:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {payload[:300]!r}")
        return (json.loads(payload) if payload else None), dt

    def metrics(self):
        status, payload, _ = self.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics: HTTP {status}")
        out = {}
        for line in payload.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out

    def pool_ready(self, image=None):
        """Ready sandboxes in the python pool, or in the pool of `image`."""
        health, _ = self.json("GET", "/healthz")
        if image is None:
            return health["pool"]["python"]
        return health["pool"]["images"].get(image, 0)


def run_ok(status, payload):
    """Whether a /v1/runs answer is a successful run printing EXPECTED_STDOUT; (ok, parsed
    result or None)."""
    if status != 200:
        return False, None
    try:
        result = json.loads(payload)
    except ValueError:
        return False, None
    return result.get("exit_code") == 0 and result.get("stdout") == EXPECTED_STDOUT, result


def wait_pool_full(client, size, image=None, limit=60.0):
    """Seconds until /healthz shows `size` ready sandboxes in the python pool, or in the pool of
    `image` (polled every 5 ms)."""
    t0 = time.perf_counter()
    while client.pool_ready(image) < size:
        if time.perf_counter() - t0 > limit:
            pool = "the python pool" if image is None else f"the pool of {image}"
            raise RuntimeError(f"{pool} did not reach {size} ready sandboxes in {limit:.0f} s")
        time.sleep(0.005)
    return time.perf_counter() - t0


# --- Baselines ----------------------------------------------------------------------------

BASELINES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines")


def figures_of(overheads=None, ratios=None, targets=None, extra=None):
    """One flat {name: number} of a bench's verdict figures, for its baseline; a ratio is a
    number or a {"value": number}, and a figure without a number is left out."""
    figures = {}
    for name, v in (overheads or {}).items():
        figures[f"overhead_{name}_ms"] = v
    for name, r in (ratios or {}).items():
        figures[f"ratio_{name}"] = r["value"] if isinstance(r, dict) else r
    for name, t in (targets or {}).items():
        figures[name] = t["value"]
    figures.update(extra or {})
    return {k: v for k, v in figures.items() if isinstance(v, (int, float))}


def against_baseline(bench, figures, show=True):
    """Prints each figure's change against bench/baselines/BENCH.json (the last run's), then
    keeps these figures there. Information only: this machine is shared and noisy, so no
    change is a verdict. Returns the baseline it compared with."""
    figures = {re.sub(r"[^A-Za-z0-9_.]+", "_", k).strip("_"): v for k, v in figures.items()}
    path = os.path.join(BASELINES, f"{bench}.json")
    try:
        with open(path) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = {}
    if show:
        for name, v in figures.items():
            was = before.get(name)
            if isinstance(was, (int, float)) and was and not name.endswith("_pct"):
                change = f"was {was:.3f}, {v - was:+.3f} ({(v / was - 1) * 100:+.1f}%)"
            elif isinstance(was, (int, float)):
                change = f"was {was:.3f}, {v - was:+.3f}"
            else:
                change = "no baseline"
            print(f"BASELINE {name} {v:.3f} ({change})")
    os.makedirs(BASELINES, exist_ok=True)
    with open(path, "w") as f:
        json.dump(figures, f, indent=1, sort_keys=True)
        f.write("\n")
    return before


# --- Verdicts -----------------------------------------------------------------------------


def check_targets(spec, values):
    """{name: value, target, direction, status} for each (name, target, direction) of `spec`,
    the value taken from `values`: PASS or MISS, SKIP without a value."""
    targets = {}
    for name, target, op in spec:
        v = values[name]
        status = "SKIP" if v is None else ("PASS" if (v <= target if op == "<=" else v >= target) else "MISS")
        targets[name] = {"value": v, "target": target, "direction": op, "status": status}
    return targets


def differences(spec, p50):
    """{name: p50(a) - p50(b)} for each (name, a, b) of `spec`; None where either is missing."""
    return {name: (p50(a) - p50(b) if p50(a) is not None and p50(b) is not None else None)
            for name, a, b in spec}


def print_overheads(overheads):
    for name, v in overheads.items():
        print(f"OVERHEAD {name} {fmt(v)} ms")


def print_targets(targets):
    for name, t in targets.items():
        print(f"TARGET {name} {fmt(t['value'])} {t['target']:g} {t['status']}")


def print_starts(names, stats, skipped, width):
    """The table of start latencies of bench/startup.py and bench/docker.py: one row per
    measured variant (in the order of `names`), then the skipped ones."""
    print(f"{'variant':<{width}} {'median ms':>10} {'p90 ms':>9} {'min ms':>9} {'failed':>7}  command")
    for name in names:
        if name not in stats:
            continue
        s = stats[name]
        cmd = " ".join(s["argv"])
        if len(cmd) > 60:
            cmd = "..." + cmd[-57:]
        print(f"{name:<{width}} {s['median_ms']:>10.2f} {s['p90_ms']:>9.2f} {s['min_ms']:>9.2f} "
              f"{s['failed_runs']:>7}  {cmd}")
    for name, why in skipped.items():
        print(f"{name:<{width}} {'skipped':>10}  {why}")


def start_stats(active, samples, failures, skipped, n):
    """{name: argv, runs, failed_runs, median_ms, p90_ms, min_ms, mean_ms, stdev_ms, samples_ms}
    for each (name, argv) of `active` with samples; those without go to `skipped`."""
    stats = {}
    for name, argv in active:
        xs = samples[name]
        if not xs:
            skipped[name] = f"all {n} measured runs failed"
            continue
        stats[name] = {
            "argv": argv,
            "runs": len(xs),
            "failed_runs": failures[name],
            "median_ms": statistics.median(xs),
            "p90_ms": percentile(xs, 90),
            "min_ms": min(xs),
            "mean_ms": statistics.fmean(xs),
            "stdev_ms": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "samples_ms": [round(x, 4) for x in xs],
        }
    return stats
