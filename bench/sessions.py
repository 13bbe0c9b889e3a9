#!/usr/bin/python3
"""Sessions on every tier: how long `POST /v1/sessions` takes, and what an idle session costs in
memory, each beside an anchor measured in the same run.

Started by bench/sessions.sh, which prepares the guest, starts a private Docker Engine (with
DOCKER_HOST set for the server) and a server with `[pool] python = 1` and
`microvm = { microvm-base = POOL }`. Stdlib only; run with /usr/bin/python3.

Per variant (native, runsc, crun, docker, microvm_pooled, microvm_unpooled), in rounds whose
starting variant rotates, each on a quiet server (pools full, no sandbox but the pools' and the
open sessions'):
- anchor: `POST /v1/runs` with argv `python3 -c pass` and the variant's fields: a cold run in
  that tier (an argv run is never pooled; a microvm run restores microvm-base's snapshot, as
  every microvm run does);
- create: `POST /v1/sessions` with the variant's fields, to its answer; /metrics pool hits and
  misses around it say whether a clone served it (microvm_pooled must be a hit, and
  microvm_unpooled, another memory limit, a miss: its agent's guest is restored from the
  run the server saved the first time it met that shape, or booted and saved that first time);
- first exec: `1+1` in the new session (create + first exec is the time to a first answer);
- idle PSS: once the pools are full again and BENCH_SETTLE seconds have passed, the summed
  PSS (/proc/PID/smaps_rollup) of the session's processes: for native and crun its whole tree
  under the server; for runsc its sandbox and gofer processes (the whole tree is shown too);
  for docker the container's processes (under the engine's shim, not the server); for microvm
  the QEMU process. Beside it, at the same moment, the tier's idle pooled sandbox: the pooled
  clone's QEMU for microvm; for native, runsc, crun and docker, which have no pool of their
  own, the native pooled python sandbox's whole tree;
- then the session is deleted and its processes awaited.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import (Client, against_baseline, children_map, descendants, figures_of, fmt, loadavg,  # noqa: E402
                     pss_kib, summary)

ANCHOR_ARGV = ["python3", "-c", "pass"]
# A memory limit no pooled clone has: a microvm session of it is not served by the pool. Its
# agent's guest is booted and saved (RunRequest::resume_at) the first time this shape is seen on
# the machine, and restored from that saved run after: BENCH_UNPOOLED_MEMORY set to a limit
# never used before makes the warm-up round's session a boot.
UNPOOLED_MEMORY = os.environ.get("BENCH_UNPOOLED_MEMORY", "640M")

# (variant, the fields its session and its anchor run share, what its idle PSS counts, what its
# PSS anchor is: "native" for the native pooled sandbox, "clone" for a pooled microVM clone).
VARIANTS = [
    ("native", {"tier": "native"}, "the sandbox's processes", "native"),
    ("runsc", {"runtime": "runsc"}, "runsc's sandbox and gofer processes", "native"),
    ("crun", {"runtime": "crun"}, "the sandbox's processes", "native"),
    ("docker", {"runtime": "docker"}, "the container's processes", "native"),
    ("microvm_pooled", {"tier": "microvm"}, "its QEMU", "clone"),
    ("microvm_unpooled", {"tier": "microvm", "limits": {"memory": UNPOOLED_MEMORY}}, "its QEMU", "clone"),
]
PSS_ANCHORS = {
    "native": "the native pooled python sandbox (all its processes), the same moment",
    "clone": "an idle pooled microvm-base clone's QEMU, the same moment",
}


def say(*parts):
    print("sessions:", *parts, file=sys.stderr, flush=True)


# --- Processes ----------------------------------------------------------------------------


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command's name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def started(pid):
    fields = stat_fields(pid)
    return int(fields[19]) if fields else 0


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


class Tree:
    """The server's sandboxes as they are now: each child of the server is the root of one
    sandbox's processes (its supervisor and all below it)."""

    def __init__(self, server_pid):
        children = children_map()
        self.subtrees = {root: [root] + descendants(root, children) for root in children.get(server_pid, [])}

    def roots(self):
        return set(self.subtrees)

    def is_vm(self, root):
        return any(comm(p).startswith("qemu-system") for p in self.subtrees[root])

    def qemu(self, root):
        return [p for p in self.subtrees[root] if comm(p).startswith("qemu-system")]


def runsc_parts(pids):
    """Of a runsc sandbox's processes, gVisor's own: the sandbox (`runsc boot`, with its ptrace
    stubs below it) and the gofer (`runsc gofer`); not `runsc run`, the launcher or Kennel's
    supervisor."""
    tops = [p for p in pids if {"boot", "gofer"} & set(cmdline(p)[1:])]
    children = children_map()
    return sorted({q for p in tops for q in [p] + descendants(p, children)})


def pss_mib(pids):
    return sum(pss_kib(p) or 0 for p in pids) / 1024


def mib_summary(xs):
    """p50/min/max of MiB samples (None when there are none)."""
    if not xs:
        return None
    return {"p50_mib": statistics.median(xs), "min_mib": min(xs), "max_mib": max(xs),
            "samples": [round(x, 2) for x in xs]}


# --- The private Docker Engine ------------------------------------------------------------


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.socket_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(self.socket_path)
        self.sock = s


def docker_get(path):
    """The engine's JSON answer to GET path, on DOCKER_HOST's unix socket."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host.startswith("unix://"):
        raise RuntimeError(f"DOCKER_HOST is {host!r}, not a unix socket (bench/sessions.sh sets it)")
    conn = UnixConnection(host[len("unix://"):])
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    if r.status != 200:
        raise RuntimeError(f"docker GET {path}: HTTP {r.status}: {body[:200]!r}")
    return json.loads(body)


def containers():
    return {c["Id"] for c in docker_get("/containers/json")}


def container_pids(ids):
    """(every process of the containers `ids`, as the engine's `top` lists them: the init and
    what `docker exec` started beside it, the session's agent; the engine's shim above each
    init)."""
    pids, shims = [], []
    for cid in ids:
        top = docker_get(f"/containers/{cid}/top")
        column = top["Titles"].index("PID")
        pids += [int(row[column]) for row in top["Processes"]]
        init = docker_get(f"/containers/{cid}/json")["State"]["Pid"]
        fields = stat_fields(init) if init else None
        if fields:
            shims.append(int(fields[1]))
    return pids, shims


# --- The server ---------------------------------------------------------------------------


class Server:
    """The server under measure: its HTTP client, its pid, and the pools it keeps full."""

    def __init__(self, client, pid, pool, tiers):
        self.client, self.pid, self.pool = client, pid, pool
        self.vm = "microvm" in tiers

    def pools_full(self):
        health, _ = self.client.json("GET", "/healthz")
        python = health["pool"]["python"] >= 1
        vm = not self.vm or health["pool"]["microvm"].get("microvm-base", 0) >= self.pool
        return python and vm

    def quiet(self, sessions, limit=900.0):
        """Waits until the pools are full and the server has no sandbox but the pools' and
        `sessions` open ones with processes under it (a run's sandbox is torn down after its
        answer); the Tree then."""
        want = 1 + (self.pool if self.vm else 0) + sessions
        t0 = time.perf_counter()
        while True:
            if self.pools_full():
                tree = Tree(self.pid)
                if len(tree.subtrees) == want:
                    return tree
            if time.perf_counter() - t0 > limit:
                raise RuntimeError(f"the server did not settle to {want} sandboxes in {limit:.0f} s")
            time.sleep(0.05)

    def pool_counts(self):
        m = self.client.metrics()
        return m.get("kennel_pool_hits_total", 0.0), m.get("kennel_pool_misses_total", 0.0)


def anchor_run(server, fields):
    body = {"argv": ANCHOR_ARGV, **fields}
    status, payload, dt = server.client.request("POST", "/v1/runs", body)
    result = json.loads(payload) if status == 200 else None
    if result is None or result.get("exit_code") != 0:
        raise RuntimeError(f"anchor run {fields}: HTTP {status}: {payload[:300]!r}")
    return dt


def first_exec(server, sid):
    body = {"language": "python", "code": "1+1"}
    status, payload, dt = server.client.request("POST", f"/v1/sessions/{sid}/exec", body)
    result = json.loads(payload) if status == 200 else {}
    values = [r.get("data", {}).get("text/plain") for r in result.get("results", [])]
    if result.get("exit_code") != 0 or "2" not in values:
        raise RuntimeError(f"exec 1+1 in session {sid}: HTTP {status}: {payload[:300]!r}")
    return dt


def session_of(variant, pooled, before, after):
    """The root of the session's sandbox: the new one, or for a pooled clone the one the pool
    handed out (its oldest: the pool hands out first what it made first), which a refill has
    since replaced with a new one."""
    if pooled:
        clones = [r for r in before.roots() if before.is_vm(r) and r in after.subtrees]
        return min(clones, key=started)
    new = after.roots() - before.roots()
    if len(new) != 1:
        raise RuntimeError(f"{variant}: expected one new sandbox under the server, found {sorted(new)}")
    return new.pop()


def idle_memory(variant, tree, root, docker_ids):
    """(headline PSS, all the session's processes' PSS, native pooled sandbox's PSS, a pooled
    clone's QEMU PSS) in MiB, read at one moment."""
    pids = tree.subtrees[root] if root else []
    whole = pss_mib(pids)
    if variant == "runsc":
        head = pss_mib(runsc_parts(pids))
    elif variant == "docker":
        inside, shims = container_pids(docker_ids)
        head = pss_mib(inside)
        whole += head + pss_mib(shims)
    elif variant.startswith("microvm"):
        head = pss_mib(tree.qemu(root))
    else:
        head = whole
    others = [r for r in tree.subtrees if r != root]
    native = [r for r in others if not tree.is_vm(r)]
    clones = [r for r in others if tree.is_vm(r)]
    native_pss = pss_mib(tree.subtrees[native[0]]) if native else None
    clone_pss = pss_mib(tree.qemu(clones[0])) if clones else None
    return head, whole, native_pss, clone_pss


def alive(pid):
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def end_session(server, sid, root, docker_ids, limit=60.0):
    """Deletes the session and waits until its sandbox's processes (or its container) are
    gone."""
    status, payload, _ = server.client.request("DELETE", f"/v1/sessions/{sid}")
    if status not in (200, 204):
        raise RuntimeError(f"DELETE session {sid}: HTTP {status}: {payload[:200]!r}")
    t0 = time.perf_counter()
    while (root and alive(root)) or (docker_ids and docker_ids & containers()):
        if time.perf_counter() - t0 > limit:
            raise RuntimeError(f"session {sid}'s sandbox still there {limit:.0f} s after DELETE")
        time.sleep(0.05)


def one_round(server, variant, fields, anchor_first, settle):
    """One sample of every figure of `variant`."""
    out = {}
    if anchor_first:
        server.quiet(0)
        out["anchor"] = anchor_run(server, fields)
    before = server.quiet(0)
    ids_before = containers() if variant == "docker" else set()
    hits0, misses0 = server.pool_counts()
    status, payload, dt = server.client.request("POST", "/v1/sessions", fields)
    hits1, misses1 = server.pool_counts()
    if status not in (200, 201):
        raise RuntimeError(f"{variant}: POST /v1/sessions: HTTP {status}: {payload[:300]!r}")
    info = json.loads(payload)
    sid = info["id"]
    out["create"] = dt
    out["pooled"] = hits1 - hits0 == 1 and misses1 == misses0
    out["isolation"] = info.get("isolation")
    out["exec"] = first_exec(server, sid)
    # A docker session has no process under the server: its agent runs in the container, which
    # Kennel drives through the engine's API.
    hosted = 0 if variant == "docker" else 1
    after = server.quiet(hosted)
    root = session_of(variant, out["pooled"], before, after) if hosted else None
    docker_ids = containers() - ids_before if variant == "docker" else set()
    time.sleep(settle)
    after = server.quiet(hosted)
    out["pss"], out["pss_all"], out["native_pss"], out["clone_pss"] = idle_memory(variant, after, root, docker_ids)
    end_session(server, sid, root, docker_ids)
    if not anchor_first:
        server.quiet(0)
        out["anchor"] = anchor_run(server, fields)
    return out


def measure(server, variants, n, warmup, settle):
    """({variant: [measured samples]}, {variant: [warm-up samples]})."""
    samples = {v[0]: [] for v in variants}
    first = {v[0]: [] for v in variants}
    for r in range(warmup + n):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, fields, _, _ in order:
            s = one_round(server, name, fields, anchor_first=r % 2 == 0, settle=settle)
            if s["pooled"] != (name == "microvm_pooled"):
                say(f"{name}: the session was{'' if s['pooled'] else ' not'} served by a pooled clone "
                    "(/metrics pool hits); its figures are not what its name says")
            (samples if r >= warmup else first)[name].append(s)
            say(f"round {r + 1 - warmup if r >= warmup else 'warm-up'} {name}: create {s['create'] * 1000:.0f} ms, "
                f"anchor {s['anchor'] * 1000:.0f} ms, exec {s['exec'] * 1000:.0f} ms, pss {s['pss']:.1f} MiB"
                f"{', pooled' if s['pooled'] else ''}")
    return samples, first


def isolation_words(isolation):
    """The answer's isolation in a few words: the tier, the runtime's name, and any platform or
    accelerator it names (at its top or one level down)."""
    words = [isolation.get("tier")]
    for key, value in isolation.items():
        inner = value if isinstance(value, dict) else {}
        if key == "runtime":
            words.append(inner.get("name"))
        words += [inner.get("platform"), inner.get("accelerator")]
    words.append(isolation.get("accelerator"))
    return " ".join(w for w in words if isinstance(w, str))


# --- Figures ------------------------------------------------------------------------------


def ms(xs, key):
    return [s[key] * 1000 for s in xs]


def mib(xs, key):
    return [s[key] for s in xs if s[key] is not None]


def figures(variants, samples):
    """Each variant's summaries and its ratios to its anchors (of p50s)."""
    out = {}
    for name, _, what, anchor in variants:
        xs = samples[name]
        create, run = summary(ms(xs, "create")), summary(ms(xs, "anchor"))
        first = summary([(s["create"] + s["exec"]) * 1000 for s in xs])
        pss = mib_summary(mib(xs, "pss"))
        pss_anchor = mib_summary(mib(xs, "native_pss" if anchor == "native" else "clone_pss"))
        isolation = xs[-1]["isolation"] or {}
        out[name] = {
            "create_ms": create,
            "anchor_run_ms": run,
            "create_vs_anchor": create["p50_ms"] / run["p50_ms"],
            "first_exec_vs_anchor": first["p50_ms"] / run["p50_ms"],
            "create_and_first_exec_ms": first,
            "exec_ms": summary(ms(xs, "exec")),
            "pooled": sum(s["pooled"] for s in xs),
            "rounds": len(xs),
            "isolation": isolation_words(isolation),
            "pss_mib": pss,
            "pss_counts": what,
            "pss_all_mib": mib_summary(mib(xs, "pss_all")),
            "pss_anchor_mib": pss_anchor,
            "pss_anchor": PSS_ANCHORS[anchor],
            "pss_vs_anchor": (pss["p50_mib"] / pss_anchor["p50_mib"]) if pss and pss_anchor else None,
        }
    return out


def ratio_text(r):
    """A ratio with three decimals, or in e-notation when it is below 0.01 (a pooled create
    beside a run)."""
    return "n/a" if r is None else (f"{r:.3f}" if r >= 0.01 else f"{r:.2e}")


def print_table(title, columns, rows, note):
    """A titled table: `columns` are (header, width) with the first left-aligned and the last
    unpadded, each row one cell per column."""
    print(title)
    for cells in [[h for h, _ in columns]] + rows:
        first, *middle, last = zip(cells, (w for _, w in columns))
        print(f"{first[0]:<{first[1]}} " + " ".join(f"{c:>{w}}" for c, w in middle) + f"  {last[0]}")
    print(note)
    print()


def report(out, n):
    creates = []
    memory = []
    for name, f in out.items():
        c, a, e = f["create_ms"], f["anchor_run_ms"], f["create_and_first_exec_ms"]
        creates.append([name, f"{c['p50_ms']:.1f}", f"{c['min_ms']:.1f}", f"{a['p50_ms']:.1f}", f"{a['min_ms']:.1f}",
                        ratio_text(f["create_vs_anchor"]), f"{e['p50_ms']:.1f}", ratio_text(f["first_exec_vs_anchor"]),
                        f"{f['pooled']}/{f['rounds']}", f["isolation"]])
        p, a, w = f["pss_mib"], f["pss_anchor_mib"], f["pss_all_mib"]
        memory.append([name, fmt(p and p["p50_mib"], ".1f"), fmt(w and w["p50_mib"], ".1f"),
                       fmt(a and a["p50_mib"], ".1f"), ratio_text(f["pss_vs_anchor"]),
                       f"{f['pss_counts']} / {f['pss_anchor']}"])
    print_table(f"session create, {n} rounds, beside a cold `python3 -c pass` run (POST /v1/runs, argv) in the same tier",
                [("variant", 16), ("create p50", 10), ("min", 8), ("run p50", 9), ("min", 8), ("ratio", 8),
                 ("+exec p50", 10), ("ratio", 6), ("pooled", 7), ("isolation", 0)], creates,
                "(ms; ratios of p50s to the run's; `+exec` is the create and the first exec of `1+1`; "
                "`pooled`: sessions a clone served, by /metrics)")
    print_table("idle PSS per session (MiB, p50), beside the tier's idle pooled sandbox read at the same moment",
                [("variant", 16), ("session", 8), ("all", 7), ("anchor", 7), ("ratio", 6), ("counts / anchor", 0)],
                memory, "(`all`: every process of the session's sandbox under the server (Kennel's supervisor, "
                "the launcher, the runtime); for docker, the container's and its shim)")
    for name, r in ratio_lines(out).items():
        print(f"RATIO {name} {ratio_text(r)}")


def print_first(first):
    """The warm-up round's creates, kept out of the figures: on a machine where a shape's agent
    was never saved, its first microvm session boots (and saves) it."""
    words = [f"{name} {xs[0]['create'] * 1000:.0f} ms (+exec {(xs[0]['create'] + xs[0]['exec']) * 1000:.0f} ms)"
             for name, xs in first.items() if xs]
    if words:
        print("warm-up round (not in the figures): create " + ", ".join(words))


def ratio_lines(out):
    """{name: ratio} of every RATIO line: each figure over its anchor, then pooled over not."""
    ratios = {}
    for key, what in (("create_vs_anchor", "create_{}_vs_run_{}"), ("first_exec_vs_anchor", "first_exec_{}_vs_run_{}"),
                      ("pss_vs_anchor", "pss_{}_vs_pooled")):
        ratios.update({what.format(n, n): f[key] for n, f in out.items() if f[key] is not None})
    if "microvm_pooled" in out and "microvm_unpooled" in out:
        p, u = out["microvm_pooled"], out["microvm_unpooled"]
        ratios["create_microvm_pooled_vs_unpooled"] = p["create_ms"]["p50_ms"] / u["create_ms"]["p50_ms"]
        ratios["first_exec_microvm_pooled_vs_unpooled"] = (p["create_and_first_exec_ms"]["p50_ms"]
                                                          / u["create_and_first_exec_ms"]["p50_ms"])
    return ratios


def baseline_figures(out):
    extra = {}
    for name, f in out.items():
        extra[f"create_{name}_p50_ms"] = f["create_ms"]["p50_ms"]
        extra[f"run_{name}_p50_ms"] = f["anchor_run_ms"]["p50_ms"]
        extra[f"create_exec_{name}_p50_ms"] = f["create_and_first_exec_ms"]["p50_ms"]
        if f["pss_mib"]:
            extra[f"pss_{name}_mib"] = f["pss_mib"]["p50_mib"]
    return figures_of(ratios=ratio_lines(out), extra=extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--pool", type=int, required=True)
    ap.add_argument("--tiers", default="native,runsc,crun,docker,microvm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tiers = set(args.tiers.split(","))
    unknown = tiers - {"native", "runsc", "crun", "docker", "microvm"}
    if unknown:
        raise SystemExit(f"sessions.py: unknown tiers {sorted(unknown)}")
    variants = [v for v in VARIANTS if v[0].split("_")[0] in tiers]
    u = urllib.parse.urlparse(args.url)
    server = Server(Client(u.hostname, u.port, timeout=600), args.server_pid, args.pool, tiers)
    n = int(os.environ.get("BENCH_N", "10"))
    warmup = int(os.environ.get("BENCH_WARMUP", "1"))
    settle = float(os.environ.get("BENCH_SETTLE", "1"))

    t0 = time.perf_counter()
    server.quiet(0)
    say(f"pools full after {time.perf_counter() - t0:.1f} s")
    load_before = loadavg()
    samples, first = measure(server, variants, n, warmup, settle)
    out = figures(variants, samples)
    meta = {"rounds": n, "warmup": warmup, "settle_s": settle, "microvm_pool": args.pool,
            "unpooled_memory": UNPOOLED_MEMORY, "load": [load_before, loadavg()],
            "first_round": {name: [{k: s[k] for k in ("create", "exec", "pooled")} for s in xs]
                            for name, xs in first.items()}}
    figs = baseline_figures(out)
    if args.json:
        against_baseline("sessions", figs, show=False)
        print(json.dumps({**meta, "variants": out}, indent=2))
        return
    print(f"load {meta['load'][0]} -> {meta['load'][1]}")
    report(out, n)
    print_first(meta["first_round"])
    print()
    against_baseline("sessions", figs)


if __name__ == "__main__":
    main()
