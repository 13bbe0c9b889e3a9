#!/usr/bin/python3
"""Background processes and terminals in a native session, each figure beside an anchor
measured in the same run.

Started by bench/processes.sh, which starts a server without pools and runs this with a
virtualenv's python that has PyPI's websockets (without it, the WebSocket parts are skipped
and say so). Everything happens in one native session:

1. Process start: `POST /v1/sessions/{id}/processes` of `["/bin/true"]` to its 201 answer,
   against `POST /v1/sessions/{id}/exec` of bash `true` to its answer, interleaved (the first
   one alternating from round to round). Target: p50 <= 5 ms.
2. Keystroke echo: one byte (`x`) sent over the terminal WebSocket
   (`/v1/sessions/{id}/pty`, bash --login on the sandbox's pty) until a frame brings it back,
   against the same client on bash on a host pty bridged by bench/pty-bridge.py (a
   `websockets` server), interleaved. A DEL after each `x`, untimed, keeps the line empty.
   Target: p50 <= 2 ms. A server without terminals (the route answers 404) skips it.
3. Memory: the server's VmRSS (/proc/PID/status), and the session's agent's, sampled every
   50 ms: at rest; while 64 processes flood stdout (`yes`) and two SSE clients read one of
   them; then while 8 terminals flood too (`yes` typed into each, a WebSocket client reading
   each); and at rest again once they are all gone.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Client, against_baseline, check_targets, children_map, descendants, figures_of, fmt,  # noqa: E402
                     loadavg, percentile, print_targets, status_kib)

try:
    from websockets.sync.client import connect as ws_connect
except ImportError:  # run by /usr/bin/python3 without the virtualenv
    ws_connect = None

HERE = os.path.dirname(os.path.abspath(__file__))
N = int(os.environ.get("BENCH_N", "50"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "3"))
FLOOD = float(os.environ.get("BENCH_FLOOD", "4"))
REST = float(os.environ.get("BENCH_REST", "2"))
FLOODERS = 64  # sessions.max_processes
TERMINALS = 8  # sessions.max_terminals
SSE_READERS = 2
FLOOD_ARGV = ["/usr/bin/yes", "kennel flood"]
SAMPLE_EVERY = 0.05
TARGETS = [("process_start_p50_ms", 5, "<="), ("echo_p50_ms", 2, "<=")]
NO_TERMINALS = "skipped: the server has no terminals"


def say(*parts):
    print("processes:", *parts, file=sys.stderr, flush=True)


def stats(xs):
    """p50/p90/min/max of seconds, in ms (None when there are none)."""
    if not xs:
        return None
    ms = [x * 1000 for x in xs]
    return {"runs": len(ms), "p50_ms": statistics.median(ms), "p90_ms": percentile(ms, 90),
            "min_ms": min(ms), "max_ms": max(ms), "samples_ms": [round(x, 4) for x in ms]}


# --- The session --------------------------------------------------------------------------


class Session:
    """One native session on the server under measure, and the ways it is driven."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.client = Client(self.host, self.port)
        info, _ = self.client.json("POST", "/v1/sessions", {"tier": "native"}, want=(200, 201))
        self.id = info["id"]
        self.path = f"/v1/sessions/{self.id}"

    def start(self, body):
        """(the started process's pid, seconds to the answer)."""
        status, payload, dt = self.client.request("POST", f"{self.path}/processes", body)
        if status != 201:
            raise RuntimeError(f"POST processes {body}: HTTP {status}: {payload[:300]!r}")
        return json.loads(payload)["pid"], dt

    def exec_true(self):
        status, payload, dt = self.client.request("POST", f"{self.path}/exec", {"language": "bash", "code": "true"})
        if status != 200 or json.loads(payload).get("exit_code") != 0:
            raise RuntimeError(f"exec true: HTTP {status}: {payload[:300]!r}")
        return dt

    def has_terminals(self):
        status, payload, _ = self.client.request("GET", f"{self.path}/terminals")
        if status in (404, 405):
            return False
        if status != 200:
            raise RuntimeError(f"GET terminals: HTTP {status}: {payload[:300]!r}")
        return True

    def terminals(self):
        listed, _ = self.client.json("GET", f"{self.path}/terminals")
        return [t["pid"] for t in listed]

    def new_terminal(self, limit=10.0):
        """A new terminal's id; a 429 (the last one deleted not yet gone) is tried again."""
        t0 = time.perf_counter()
        while True:
            status, payload, _ = self.client.request("POST", f"{self.path}/terminals", {"cols": 80, "rows": 24})
            if status == 201:
                return json.loads(payload)["pid"]
            if status != 429 or time.perf_counter() - t0 > limit:
                raise RuntimeError(f"POST terminals: HTTP {status}: {payload[:300]!r}")
            time.sleep(0.05)

    def stdout_bytes(self):
        """{pid: stdout bytes produced so far} of the processes listed (running, and the last
        ended)."""
        listed, _ = self.client.json("GET", f"{self.path}/processes")
        return {p["pid"]: p["stdout_bytes"] for p in listed}

    def delete(self, what):
        status, payload, _ = self.client.request("DELETE", f"{self.path}/{what}")
        if status not in (204, 404):  # 404: it had ended already
            raise RuntimeError(f"DELETE {what}: HTTP {status}: {payload[:200]!r}")

    def ws_url(self, tail):
        return f"ws://{self.host}:{self.port}{self.path}/{tail}"

    def end(self):
        self.client.request("DELETE", self.path)


# --- 1. Process start ---------------------------------------------------------------------


def process_start(session):
    """({"process_start": [s], "exec_true": [s]}) over WARMUP + N interleaved rounds."""
    samples = {"process_start": [], "exec_true": []}
    variants = [("process_start", lambda: session.start({"argv": ["/bin/true"]})[1]),
                ("exec_true", session.exec_true)]
    for r in range(WARMUP + N):
        for name, once in (variants if r % 2 == 0 else variants[::-1]):
            dt = once()
            if r >= WARMUP:
                samples[name].append(dt)
    return samples


# --- 2. Keystroke echo --------------------------------------------------------------------


class Terminal:
    """A WebSocket to a shell on a pty: Kennel's terminal or the host anchor's bridge."""

    def __init__(self, url):
        self.url = url
        # legacy=True: a connection held open across calls, closed by close() (websockets 17).
        self.ws = ws_connect(url, compression=None, max_size=None, open_timeout=30, close_timeout=2, legacy=True)
        self.received = 0

    def frame(self, timeout):
        """The next output frame's bytes; a text frame is a JSON event, and an exit ends it."""
        message = self.ws.recv(timeout=timeout)
        if isinstance(message, str):
            event = json.loads(message)
            if event.get("type") == "exit":
                raise RuntimeError(f"{self.url}: the shell exited: {message}")
            return b""
        self.received += len(message)
        return message

    def settle(self, quiet=0.5, limit=20.0):
        """Reads until nothing has come for `quiet` seconds (the replay, the prompt)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit:
            try:
                self.frame(quiet)
            except TimeoutError:
                return
        raise RuntimeError(f"{self.url}: output did not stop within {limit:.0f} s")

    def until(self, want, timeout=10.0):
        buf = b""
        while want not in buf:
            buf += self.frame(timeout)

    def keystroke(self):
        """Seconds from sending `x` to the frame that echoes it; then a DEL, untimed."""
        t0 = time.perf_counter()
        self.ws.send(b"x")
        self.until(b"x")
        dt = time.perf_counter() - t0
        self.ws.send(b"\x7f")
        self.until(b"\x08")
        return dt

    def close(self):
        self.ws.close()


class Bridge:
    """bench/pty-bridge.py, the anchor's server, started and stopped by pid."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "pty-bridge.py")],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.port = int(self.proc.stdout.readline())
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(10)


def keystroke_echo(session):
    """{"echo": [s], "echo_host_pty": [s]} over WARMUP + N interleaved rounds."""
    with Bridge() as bridge:
        kennel = Terminal(session.ws_url("pty?cols=80&rows=24"))
        host = Terminal(f"ws://127.0.0.1:{bridge.port}/")
        try:
            for t in (kennel, host):
                t.settle()
            samples = {"echo": [], "echo_host_pty": []}
            pairs = [("echo", kennel), ("echo_host_pty", host)]
            for r in range(WARMUP + N):
                for name, t in (pairs if r % 2 == 0 else pairs[::-1]):
                    dt = t.keystroke()
                    if r >= WARMUP:
                        samples[name].append(dt)
        finally:
            kennel.close()
            host.close()
    for tid in session.terminals():
        session.delete(f"terminals/{tid}")
    return samples


# --- 3. Memory under a flood --------------------------------------------------------------


def agent_pid(server_pid):
    """The session's agent: the outermost `python3 -c <boot>` under the server (no pool, so
    the session's sandbox is the server's only one)."""
    children = children_map()
    for pid in descendants(server_pid, children):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_kennel_boot" in f.read():
                    return pid
        except OSError:
            continue
    return None


def sample(pids, seconds):
    """{name: [KiB every SAMPLE_EVERY s for `seconds`]} of each {name: pid}'s VmRSS."""
    out = {name: [] for name in pids}
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for name, pid in pids.items():
            kib = status_kib(pid, "VmRSS")
            if kib is not None:
                out[name].append(kib)
        time.sleep(SAMPLE_EVERY)
    return out


class Reader(threading.Thread):
    """Reads a stream until told to stop, counting its bytes: an SSE output stream or a
    terminal's WebSocket."""

    def __init__(self, what):
        super().__init__(daemon=True)
        self.what, self.bytes, self.error = what, 0, None
        self.stopping = threading.Event()
        self.t0 = self.t1 = None

    def rate(self):
        """MB/s read (10^6 bytes) from its first byte to its stop."""
        return self.bytes / 1e6 / (self.t1 - self.t0) if self.t0 and self.t1 and self.t1 > self.t0 else 0.0

    def run(self):
        try:
            self.read()
        except Exception as e:  # noqa: BLE001 - reported with the figures, not raised in a thread
            if not self.stopping.is_set():
                self.error = f"{type(e).__name__}: {e}"
        self.t1 = self.t1 or time.perf_counter()

    def stop(self):
        self.t1 = time.perf_counter()
        self.stopping.set()
        self.interrupt()
        self.join(10)


class SseReader(Reader):
    def __init__(self, session, pid):
        super().__init__(f"SSE output of process {pid}")
        self.conn = http.client.HTTPConnection(session.host, session.port, timeout=30)
        self.path = f"{session.path}/processes/{pid}/output"

    def read(self):
        self.conn.request("GET", self.path, headers={"Accept": "text/event-stream"})
        r = self.conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
        self.t0 = time.perf_counter()
        while not self.stopping.is_set():
            chunk = r.read1(65536)
            if not chunk:
                raise RuntimeError("the stream ended")
            self.bytes += len(chunk)

    def interrupt(self):
        if self.conn.sock is not None:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


class TerminalReader(Reader):
    def __init__(self, session, tid):
        super().__init__(f"terminal {tid}")
        self.terminal = Terminal(session.ws_url(f"terminals/{tid}"))

    def read(self):
        self.terminal.ws.send(b"yes\n")
        self.t0 = time.perf_counter()
        while not self.stopping.is_set():
            try:
                self.terminal.frame(1.0)
            except TimeoutError:
                continue
            self.bytes = self.terminal.received

    def interrupt(self):
        self.terminal.close()


def mem_stats(kib):
    """p50/max of KiB samples, in MiB."""
    if not kib:
        return None
    return {"p50_mib": statistics.median(kib) / 1024, "max_mib": max(kib) / 1024, "samples": len(kib)}


def sse_alone(session):
    """What an SSE client reads of one `yes` running alone, for REST s: the anchor of the
    readers' rates under the flood."""
    pid = session.start({"argv": FLOOD_ARGV})[0]
    reader = SseReader(session, pid)
    try:
        reader.start()
        time.sleep(REST)
    finally:
        reader.stop()
        session.delete(f"processes/{pid}")
    return {"what": f"{reader.what}, `yes` running alone (anchor)", "mb_s": reader.rate(), "error": reader.error}


def memory(session, server_pid, terminals):
    """{phase: {"server": mem_stats, "agent": mem_stats}} and the readers' rates."""
    pids = {"server": server_pid}
    agent = agent_pid(server_pid)
    if agent:
        pids["agent"] = agent
    phases, readers = {}, {}
    phases["rest"] = sample(pids, REST)
    readers["alone"] = sse_alone(session)
    flooders = [session.start({"argv": FLOOD_ARGV})[0] for _ in range(FLOODERS)]
    sse = [SseReader(session, flooders[0]) for _ in range(SSE_READERS)]
    terms = []
    try:
        for r in sse:
            r.start()
        before, t0 = session.stdout_bytes(), time.perf_counter()
        phases["processes"] = sample(pids, FLOOD)
        after, t1 = session.stdout_bytes(), time.perf_counter()
        made = {pid: (after[pid] - before[pid]) / 1e6 / (t1 - t0) for pid in flooders}
        readers["produced"] = {"all_mb_s": sum(made.values()), "read_one_mb_s": made[flooders[0]]}
        if terminals:
            terms = [TerminalReader(session, session.new_terminal()) for _ in range(TERMINALS)]
            for r in terms:
                r.start()
            phases["terminals"] = sample(pids, FLOOD)
    finally:
        for r in sse + terms:
            r.stop()
        for tid in session.terminals() if terminals else []:
            session.delete(f"terminals/{tid}")
        for pid in flooders:
            session.delete(f"processes/{pid}")
    readers["sse"] = [{"what": r.what, "mb_s": r.rate(), "error": r.error} for r in sse]
    readers["terminals"] = [{"what": r.what, "mb_s": r.rate(), "error": r.error} for r in terms]
    phases["after"] = sample(pids, REST)
    return {p: {name: mem_stats(kib) for name, kib in s.items()} for p, s in phases.items()}, readers


# --- Figures ------------------------------------------------------------------------------


def p50(s):
    return s["p50_ms"] if s else None


def ratio(a, b):
    return a / b if a is not None and b else None


def figures(starts, echoes, mem, readers):
    variants = {name: stats(xs) for name, xs in {**starts, **echoes}.items()}
    rest = mem["rest"]["server"]["p50_mib"]
    ratios = {
        "process_start_vs_exec_true": ratio(p50(variants["process_start"]), p50(variants["exec_true"])),
        "process_start_p90_vs_exec_true_p90": ratio(variants["process_start"]["p90_ms"],
                                                    variants["exec_true"]["p90_ms"]),
        "echo_vs_host_pty": ratio(p50(variants.get("echo")), p50(variants.get("echo_host_pty"))),
        "server_rss_processes_vs_rest": ratio(mem["processes"]["server"]["max_mib"], rest),
        "server_rss_terminals_vs_rest": ratio((mem.get("terminals") or {}).get("server", {}).get("max_mib"), rest),
        "server_rss_after_vs_rest": ratio(mem["after"]["server"]["p50_mib"], rest),
        "sse_read_flood_vs_alone": ratio(statistics.median(r["mb_s"] for r in readers["sse"]),
                                         readers["alone"]["mb_s"]),
    }
    targets = check_targets(TARGETS, {"process_start_p50_ms": p50(variants["process_start"]),
                                      "echo_p50_ms": p50(variants.get("echo"))})
    return variants, ratios, targets


LABELS = {
    "process_start": "POST /v1/sessions/{id}/processes [\"/bin/true\"] to its 201",
    "exec_true": "POST /v1/sessions/{id}/exec bash `true` (anchor)",
    "echo": "one byte over the terminal WebSocket to its echo (bash --login in the sandbox)",
    "echo_host_pty": "the same client, bash on a host pty behind bench/pty-bridge.py (anchor)",
}
PHASES = {
    "rest": "the session idle, nothing running",
    "processes": f"{FLOODERS} processes `yes`, {SSE_READERS} SSE clients reading one",
    "terminals": f"and {TERMINALS} terminals `yes`, a WebSocket client reading each",
    "after": "all ended again (DELETE)",
}


def report(variants, ratios, targets, mem, readers, echo_skipped):
    print(f"{'variant':<14} {'p50 ms':>8} {'p90 ms':>8} {'min ms':>8} {'runs':>5}  what")
    for name, label in LABELS.items():
        s = variants.get(name)
        if s:
            print(f"{name:<14} {s['p50_ms']:>8.2f} {s['p90_ms']:>8.2f} {s['min_ms']:>8.2f} {s['runs']:>5}  {label}")
        else:
            print(f"{name:<14} {echo_skipped}")
    print()
    print(f"{'phase':<10} {'server RSS p50':>14} {'max':>7} {'agent RSS p50':>14} {'max':>7}  (MiB, every "
          f"{SAMPLE_EVERY * 1000:.0f} ms)")
    for phase, label in PHASES.items():
        m = mem.get(phase)
        if not m:
            print(f"{phase:<10} {NO_TERMINALS if phase == 'terminals' else 'n/a'}")
            continue
        srv, agent = m["server"], m.get("agent")
        print(f"{phase:<10} {srv['p50_mib']:>14.1f} {srv['max_mib']:>7.1f} "
              f"{fmt(agent and agent['p50_mib'], '.1f'):>14} {fmt(agent and agent['max_mib'], '.1f'):>7}  {label}")
    made = readers["produced"]
    print(f"  the {FLOODERS} processes wrote {made['all_mb_s']:.1f} MB/s to stdout in all, the one read "
          f"{made['read_one_mb_s']:.2f} MB/s (the agent's count)")
    for r in [readers["alone"]] + readers["sse"] + readers["terminals"]:
        print(f"  read {r['mb_s']:.2f} MB/s (SSE or WebSocket bytes): {r['what']}"
              f"{' (' + r['error'] + ')' if r['error'] else ''}")
    print()
    for name, r in ratios.items():
        print(f"RATIO {name} {fmt(r, '.3f')}")
    print_targets(targets)


def baseline_figures(variants, ratios, targets, mem):
    extra = {f"{name}_p50_ms": s["p50_ms"] for name, s in variants.items() if s}
    extra.update({f"server_rss_{phase}_max_mib": m["server"]["max_mib"] for phase, m in mem.items()})
    return figures_of(ratios=ratios, targets=targets, extra=extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    load_before = loadavg()
    session = Session(args.url)
    try:
        session.exec_true()
        starts = process_start(session)
        terminals = session.has_terminals()
        if ws_connect is None:
            echo_skipped = "skipped: no websockets module (bench/processes.sh makes its virtualenv)"
        elif not terminals:
            echo_skipped = NO_TERMINALS
        else:
            echo_skipped = None
        echoes = keystroke_echo(session) if echo_skipped is None else {}
        mem, readers = memory(session, args.server_pid, terminals and ws_connect is not None)
    finally:
        session.end()
    variants, ratios, targets = figures(starts, echoes, mem, readers)
    meta = {"rounds": N, "warmup": WARMUP, "flood_s": FLOOD, "rest_s": REST, "load": [load_before, loadavg()],
            "echo_skipped": echo_skipped}
    figs = baseline_figures(variants, ratios, targets, mem)
    if args.json:
        baseline = against_baseline("processes", figs, show=False)
        print(json.dumps({**meta, "variants": variants, "ratios": ratios, "targets": targets, "memory": mem,
                          "readers": readers, "baseline": baseline}, indent=1))
        return
    print(f"{N} interleaved rounds after {WARMUP}, load {meta['load'][0]} -> {meta['load'][1]}")
    report(variants, ratios, targets, mem, readers, echo_skipped)
    print()
    against_baseline("processes", figs)


if __name__ == "__main__":
    main()
