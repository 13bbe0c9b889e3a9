#!/usr/bin/python3
"""Kennel's compatibility target (issue 7): does legitimate code run unchanged in the sandbox?

Runs a selection of CPython's own regression-test modules (Debian's libpython3.11-testsuite)
and a set of realistic agent jobs, each once bare (on the host, as the calling user) and once
inside `kennel run` in each tier asked for (`--tiers native,crun,runc,runsc`), and compares
them. Writes compat/results.json and prints markdown tables.

    bash compat/setup.sh && /usr/bin/python3 compat/run.py

Options: --tiers native,crun,runc,runsc (default native)   --bare-from RESULTS_JSON (reuse bare runs)
         --modules test_os,test_pty  (a subset)   --no-modules / --no-jobs   --parallel N
         --kennel PATH (default target/release/kennel)   --out PATH   --no-rerun
Standard library only.
"""

import argparse
import base64
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"

# Each runs in well under a minute bare on a 2-CPU box (test_concurrent_futures and
# test_multiprocessing_forkserver are the slowest, ~1-3 min).
MODULES = [
    # the twelve the issue names
    "test_os", "test_posix", "test_subprocess", "test_tarfile", "test_shutil", "test_pty",
    "test_signal", "test_threading", "test_socket", "test_venv", "test_mmap", "test_tempfile",
    # files, descriptors, terminals
    "test_fileio", "test_file", "test_select", "test_selectors", "test_poll", "test_epoll",
    "test_fcntl", "test_ioctl", "test_openpty", "test_resource", "test_pathlib", "test_glob",
    "test_stat", "test_largefile", "test_compileall",
    # processes, threads, signals, time
    "test_fork1", "test_wait3", "test_wait4", "test_eintr", "test_threadsignals",
    "test_faulthandler", "test_concurrent_futures", "test_multiprocessing_forkserver",
    "test_time", "test_sched", "test_queue",
    # users, locale, platform
    "test_pwd", "test_grp", "test_getpass", "test_locale", "test_platform", "test_sysconfig",
    "test_site",
    # sockets on loopback
    "test_socketserver", "test_httpservers", "test_urllib2_localnet", "test_timeout",
    # data and pure computation
    # (test_sqlite3 is not in Debian's libpython3.11-testsuite; the sqlite job covers it)
    "test_json", "test_zipfile", "test_gzip", "test_datetime", "test_math",
    "test_re", "test_uuid", "test_logging", "test_unittest", "test_hashlib",
]

# Tests left out in both modes, with the reason. On a VM with /dev/vsock (this host), test_socket's
# VSOCK tests connect to the VM's own CID and block forever in accept() when run bare; in the
# sandbox /dev/vsock is absent and they skip. Leaving them out keeps the comparison fair.
IGNORE = {
    "test_socket": ["ThreadedVSOCKSocketStreamTest"],
}

# Left out of the bare run only: run bare as root, they change the host. test_monotonic_settime
# sets the host's wall clock back one hour (and then forward again).
BARE_IGNORE = {
    "test_time": ["test_monotonic_settime"],
}

LIMITS = ["--timeout", "900s", "--memory", "4G", "--pids", "2048", "--tmp-size", "2G",
          "--workspace-size", "1G", "--cpus", "2"]
BARE_TIMEOUT = 900

RESULT_RE = re.compile(r"^(?:Tests )?[Rr]esult: (\S+)", re.M)
FAILED_RE = re.compile(r"^(FAIL|ERROR): (\S+) \(([^)]*)\)", re.M)


def kennel_cmd(kennel, tier, argv, files=(), collect=(), json_out=False):
    cmd = [kennel, "run"] + LIMITS + ([] if tier == "native" else ["--runtime", tier])
    if json_out:
        cmd.append("--json")
    for host, inside in files:
        cmd += ["--file", f"{host}:{inside}"]
    for path in collect:
        cmd += ["--collect", path]
    return cmd + ["--"] + list(argv)


def run(cmd, cwd=None, env=None, timeout=BARE_TIMEOUT + 60):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout)
        out, err, rc = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace")
        err = (e.stderr or b"").decode("utf-8", "replace")
        rc = "timeout"
    return rc, out, err, round(time.monotonic() - t0, 1)


def bare_env(home):
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "TMPDIR": "/tmp"}


# ---------------------------------------------------------------------------------------------
# regression-test modules


def run_module(kennel, mode, module, verbose=False):
    argv = [PYTHON, "-m", "test", "-u", "none"] + (["-v"] if verbose else [])
    for pattern in IGNORE.get(module, []) + (BARE_IGNORE.get(module, []) if mode == "bare" else []):
        argv += ["-i", pattern]
    argv.append(module)
    if mode == "bare":
        with tempfile.TemporaryDirectory(prefix="kennel-compat-") as d:
            rc, out, err, secs = run(argv, cwd=d, env=bare_env(d))
    else:
        rc, out, err, secs = run(kennel_cmd(kennel, mode, argv))
    text = out + "\n" + err
    if verbose:
        # the tracebacks of a verbose run are long; keep the unittest summary at the end
        i = text.find("\n=====")
        tail = text[i:][-6000:] if i >= 0 else text[-3000:]
    else:
        tail = text[-3000:]
    m = RESULT_RE.findall(text)
    result = m[-1] if m else ("TIMEOUT" if rc == "timeout" else f"NO_RESULT(rc={rc})")
    failing = sorted({f"{kind}: {name} ({where})" for kind, name, where in FAILED_RE.findall(text)})
    ok = rc == 0 and result == "SUCCESS"
    return {"module": module, "mode": mode, "ok": ok, "result": result, "exit": rc,
            "seconds": secs, "failing": failing,
            "tail": tail if not ok else ""}


# ---------------------------------------------------------------------------------------------
# agent jobs: (name, interpreter, script, expected last line of stdout, files to collect)

JOBS = [
    ("pandas-numpy-matplotlib", PYTHON, textwrap.dedent("""\
        import os
        os.environ["MPLBACKEND"] = "Agg"
        import numpy as np, pandas as pd, matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        df = pd.DataFrame({"x": np.arange(100), "g": np.arange(100) % 4})
        agg = df.groupby("g")["x"].sum()
        a = np.linalg.inv(np.array([[2.0, 1.0], [1.0, 3.0]])) @ np.array([[2.0, 1.0], [1.0, 3.0]])
        fig, ax = plt.subplots()
        agg.plot.bar(ax=ax)
        fig.savefig("plot.png", dpi=50)
        with open("plot.png", "rb") as f:
            magic = f.read(8)
        print(f"sum={df.x.sum()} groups={list(agg)} eye={np.allclose(a, np.eye(2))} "
              f"png={magic == bytes([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])}")
        """), "sum=4950 groups=[1200, 1225, 1250, 1275] eye=True png=True", ["/workspace/plot.png"]),

    ("sqlite", "/bin/bash", textwrap.dedent("""\
        set -e
        python3 - <<'PY'
        import sqlite3
        db = sqlite3.connect("jobs.db")
        db.execute("create table t (id integer primary key, name text, n integer)")
        db.executemany("insert into t (name, n) values (?, ?)", [(f"row{i}", i) for i in range(1000)])
        db.commit()
        db.execute("create index t_n on t(n)")
        db.close()
        PY
        sqlite3 jobs.db "pragma journal_mode=wal; insert into t (name, n) values ('cli', 1000);" >/dev/null
        echo "count=$(sqlite3 jobs.db 'select count(*) from t') sum=$(sqlite3 jobs.db 'select sum(n) from t where n >= 500')"
        """), "count=1001 sum=375750", []),

    ("multiprocessing-pool", PYTHON, textwrap.dedent("""\
        import multiprocessing as mp, os
        def sq(x):
            return x * x, os.getpid()
        if __name__ == "__main__":
            out = []
            for method in ("fork", "forkserver", "spawn"):
                with mp.get_context(method).Pool(4) as pool:
                    res = pool.map(sq, range(8))
                out.append(f"{method}={sum(r for r, _ in res)}")
            print(" ".join(out), f"cpus={len(os.sched_getaffinity(0)) >= 1}")
        """), "fork=140 forkserver=140 spawn=140 cpus=True", []),

    ("venv-pip-local-wheel", "/bin/bash", textwrap.dedent("""\
        set -e
        python3 - <<'PY'
        import base64, hashlib, zipfile
        files = {
            "tinypkg/__init__.py": b"VALUE = 42\\n",
            "tinypkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: tinypkg\\nVersion: 1.0\\n",
            "tinypkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: hand\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
        }
        def h(b):
            return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
        record = "".join(f"{n},{h(b)},{len(b)}\\n" for n, b in files.items()) + "tinypkg-1.0.dist-info/RECORD,,\\n"
        import os
        os.makedirs("dist", exist_ok=True)
        with zipfile.ZipFile("dist/tinypkg-1.0-py3-none-any.whl", "w") as z:
            for n, b in files.items():
                z.writestr(n, b)
            z.writestr("tinypkg-1.0.dist-info/RECORD", record)
        PY
        python3 -m venv venv
        venv/bin/pip install -q --no-index --find-links dist tinypkg
        venv/bin/python -c 'import tinypkg, sys; print(f"value={tinypkg.VALUE} venv={sys.prefix != sys.base_prefix}")'
        """), "value=42 venv=True", []),

    ("gcc", "/bin/bash", textwrap.dedent("""\
        set -e
        cat > fib.c <<'C'
        #include <stdio.h>
        #include <math.h>
        #include <pthread.h>
        static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
        static void *worker(void *arg) { *(long *)arg = fib(25); return NULL; }
        int main(void) {
            long r = 0; pthread_t t;
            pthread_create(&t, NULL, worker, &r); pthread_join(t, NULL);
            printf("fib30=%ld fib25=%ld sqrt2=%.4f\\n", fib(30), r, sqrt(2.0));
            return 0;
        }
        C
        gcc -O2 -Wall -o fib fib.c -lm -pthread
        ./fib
        """), "fib30=832040 fib25=75025 sqrt2=1.4142", []),

    ("tar-modes", "/bin/bash", textwrap.dedent("""\
        set -e
        umask 022
        mkdir -p src/bin src/priv
        printf '#!/bin/sh\\necho hi\\n' > src/bin/run.sh; chmod 0755 src/bin/run.sh
        echo secret > src/priv/key; chmod 0600 src/priv/key; chmod 0750 src/priv
        touch -d '2020-01-02 03:04:05 UTC' src/bin/run.sh
        tar czf a.tgz src
        mkdir x1 && tar xzf a.tgz -C x1
        python3 - <<'PY'
        import io, os, tarfile, time
        # tarfile, run as root (uid 0 inside), chowns each member to its recorded owner and only
        # then sets mode and mtime: a member owned by uid 1000 needs a full id mapping.
        with tarfile.open("a.tgz") as t:
            t.extractall("x2")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = b"#!/bin/sh\\necho owned\\n"
            ti = tarfile.TarInfo("owned.sh"); ti.size = len(data); ti.mode = 0o755
            ti.uid, ti.gid, ti.mtime = 1000, 1000, 1577934245
            t.addfile(ti, io.BytesIO(data))
        buf.seek(0)
        with tarfile.open(fileobj=buf) as t:
            t.extractall("x3")
        def m(p):
            return oct(os.stat(p).st_mode & 0o7777)[2:]
        st = os.stat("x3/owned.sh")
        print(" ".join([
            f"cli={m('x1/src/bin/run.sh')},{m('x1/src/priv/key')},{m('x1/src/priv')}",
            f"py={m('x2/src/bin/run.sh')},{m('x2/src/priv/key')},{m('x2/src/priv')}",
            f"mtime={int(os.stat('x2/src/bin/run.sh').st_mtime)}",
            f"owned={m('x3/owned.sh')},{st.st_uid}:{st.st_gid},{int(st.st_mtime)}",
            f"runs={os.popen('./x3/owned.sh').read().strip()}",
        ]))
        PY
        """), "cli=755,600,750 py=755,600,750 mtime=1577934245 owned=755,1000:1000,1577934245 runs=owned", []),

    ("ids-chown-setgroups", PYTHON, textwrap.dedent("""\
        import os, subprocess
        open("f", "w").close()
        os.chown("f", 1000, 1000)
        st = os.stat("f")
        os.setgroups([1, 2, 3])
        groups = sorted(os.getgroups())
        out = subprocess.run(["id", "-u"], user="nobody", capture_output=True, text=True).stdout.strip()
        print(f"chown={st.st_uid}:{st.st_gid} groups={groups} popen_user={out}")
        """), "chown=1000:1000 groups=[1, 2, 3] popen_user=65534", []),

    ("http-loopback", PYTHON, textwrap.dedent("""\
        import http.server, threading, urllib.request, os, json
        os.makedirs("site", exist_ok=True)
        with open("site/data.json", "w") as f:
            json.dump({"items": list(range(10))}, f)
        class H(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **k):
                super().__init__(*a, directory="site", **k)
            def log_message(self, *a):
                pass
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{srv.server_address[1]}/data.json"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
            status = r.status
        srv.shutdown()
        print(f"status={status} sum={sum(body['items'])}")
        """), "status=200 sum=45", []),

    ("shell-pty-jobcontrol", "/bin/bash", textwrap.dedent("""\
        set -e
        # a pty with an interactive shell that uses job control, SIGALRM from Python
        python3 - <<'PY'
        import os, pty, signal, time
        fired = []
        signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(0.3)
        pid, fd = pty.fork()
        if pid == 0:
            os.execvp("bash", ["bash", "--norc", "-i", "-c", "sleep 0.2 & jobs -l | wc -l; wait; echo jobdone"])
        out = b""
        while True:
            try:
                b = os.read(fd, 1024)
            except OSError:
                break
            if not b:
                break
            out += b
        _, status = os.waitpid(pid, 0)
        print(f"alarm={len(fired)} pty={b'jobdone' in out} status={os.waitstatus_to_exitcode(status)}")
        PY
        """), "alarm=1 pty=True status=0", []),
]


def run_job(kennel, mode, job):
    name, interp, script, expected, collect = job
    ext = ".py" if interp == PYTHON else ".sh"
    with tempfile.TemporaryDirectory(prefix="kennel-compat-job-") as d:
        path = os.path.join(d, "job" + ext)
        with open(path, "w") as f:
            f.write(script)
        files_ok = None
        if mode == "bare":
            work = os.path.join(d, "workspace")
            os.mkdir(work)
            rc, out, err, secs = run([interp, path], cwd=work, env=bare_env(work), timeout=600)
            files_ok = all(_png_ok(open(os.path.join(work, os.path.basename(c)), "rb").read(8))
                           for c in collect if os.path.exists(os.path.join(work, os.path.basename(c))))
        else:
            cmd = kennel_cmd(kennel, mode, [interp, "/workspace/job" + ext],
                             files=[(path, "/workspace/job" + ext)], collect=collect,
                             json_out=True)
            rc, raw, err, secs = run(cmd, timeout=960)
            try:
                res = json.loads(raw)
                out, err, rc = res.get("stdout", ""), res.get("stderr", ""), res.get("exit_code")
                if collect:
                    files_ok = all(_png_ok(_content(f)) for f in res.get("files", []))
                    files_ok = files_ok and len(res.get("files", [])) == len(collect)
            except ValueError:
                out = raw
    lines = out.strip().splitlines()
    last = lines[-1] if lines else ""
    ok = rc == 0 and last == expected and files_ok is not False
    return {"job": name, "mode": mode, "ok": ok, "exit": rc, "seconds": secs, "got": last,
            "expected": expected, "collected_png_ok": files_ok,
            "tail": "" if ok else (out[-1500:] + "\n--- stderr ---\n" + err[-2500:])}


def _content(f):
    c = f.get("content") or {}
    if "base64" in c:
        return base64.b64decode(c["base64"])[:8]
    return c.get("text", "").encode("latin-1", "replace")[:8]


def _png_ok(head):
    return head[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kennel", default=os.path.join(ROOT, "target", "release", "kennel"))
    ap.add_argument("--tiers", default="native",
                    help="comma-separated: native and the OCI runtimes crun, runc, runsc")
    ap.add_argument("--bare-from", metavar="RESULTS_JSON",
                    help="take the bare runs from an earlier results file instead of running them")
    ap.add_argument("--modules", help="comma-separated subset of modules")
    ap.add_argument("--no-modules", action="store_true")
    ap.add_argument("--no-jobs", action="store_true")
    ap.add_argument("--no-rerun", action="store_true",
                    help="do not re-run, alone, a module that fails")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = ap.parse_args()

    if not os.path.exists("/usr/lib/python3.11/test/test_os.py"):
        sys.exit("libpython3.11-testsuite is missing: run bash compat/setup.sh first")
    if not os.access(args.kennel, os.X_OK):
        sys.exit(f"{args.kennel} not found: cargo build --release -p kennel -p kennel-sandbox")
    tiers = args.tiers.split(",")
    unknown = set(tiers) - {"native", "crun", "runc", "runsc"}
    if unknown:
        sys.exit(f"unknown tiers {sorted(unknown)}: use native, crun, runc, runsc")

    modules = args.modules.split(",") if args.modules else MODULES
    results = {}
    if args.bare_from:
        with open(args.bare_from) as f:
            earlier = json.load(f)
        for e in earlier["modules"]:
            results[("module", e["module"], "bare")] = e["bare"]
        for e in earlier["jobs"]:
            results[("job", e["job"], "bare")] = e["bare"]
    modes = tiers if args.bare_from else ["bare"] + tiers
    t0 = time.monotonic()
    tasks = []
    if not args.no_jobs:
        tasks += [("job", mode, job) for job in JOBS for mode in modes]
    if not args.no_modules:
        tasks += [("module", mode, m) for m in modules for mode in modes]

    with cf.ThreadPoolExecutor(max_workers=args.parallel) as ex:
        futs = {}
        for kind, mode, item in tasks:
            fn = run_job if kind == "job" else run_module
            futs[ex.submit(fn, args.kennel, mode, item)] = (kind, mode, item)
        for fut in cf.as_completed(futs):
            kind, mode, item = futs[fut]
            key = item[0] if kind == "job" else item
            r = fut.result()
            results[(kind, key, mode)] = r
            flag = "ok " if r["ok"] else "FAIL"
            print(f"[{time.monotonic() - t0:6.0f}s] {flag} {mode:6} {key} "
                  f"({r['seconds']}s{'' if r['ok'] else ', ' + str(r.get('result', r.get('got')))})",
                  file=sys.stderr, flush=True)

    # Without -v, regrtest names no test when one fails ("test_os failed -- Traceback").
    # Every failing (module, mode) runs once more, alone and verbose: that names the failing
    # tests, and tells a flake under load from a real difference.
    if not args.no_rerun and not args.no_modules:
        for m in modules:
            for mode in modes:
                r = results[("module", m, mode)]
                if not r["ok"] and "rerun" not in r:
                    print(f"re-running {m} {mode} alone, verbose", file=sys.stderr, flush=True)
                    r2 = run_module(args.kennel, mode, m, verbose=True)
                    r["rerun"] = {"ok": r2["ok"], "result": r2["result"], "failing": r2["failing"],
                                  "seconds": r2["seconds"], "tail": r2["tail"]}
    total = round(time.monotonic() - t0)

    out = {"python": sys.version.split()[0], "kennel": args.kennel, "limits": LIMITS,
           "parallel": args.parallel, "wall_seconds": total, "tiers": tiers,
           "bare_from": args.bare_from, "modules": [], "jobs": []}
    for m in modules if not args.no_modules else []:
        out["modules"].append({"module": m, **{mode: results[("module", m, mode)]
                                               for mode in ["bare"] + tiers}})
    for job in JOBS if not args.no_jobs else []:
        out["jobs"].append({"job": job[0], **{mode: results[("job", job[0], mode)]
                                              for mode in ["bare"] + tiers}})
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)

    print(render(out))
    print(f"\nwall time: {total}s; results in {os.path.relpath(args.out)}")
    return 0


def _cell(r):
    s = "pass" if r["ok"] else r.get("result") or "fail"
    if not r["ok"] and "rerun" in r:
        s += " (alone, -v: " + ("pass" if r["rerun"]["ok"] else r["rerun"]["result"]) + ")"
    return f"{s} {r['seconds']:.0f}s"


def _final(r):
    return r.get("rerun", r)


def _newly_failing(bare, r):
    """The tests failing in `r` and not bare, or its result when it names none."""
    final = _final(r)
    extra = sorted(set(final["failing"]) - set(_final(bare)["failing"]))
    names = ", ".join(sorted({x.split(" (")[0].split(": ")[1] for x in extra}))
    if not final["ok"] and not extra and bare["ok"]:
        names = final["result"]
    return names


def render(out):
    tiers = out.get("tiers", ["native"])
    lines = []
    if out["modules"]:
        lines += ["| module | bare | " + " | ".join(tiers) + " | failing in a tier, passing bare |",
                  "|---|---|" + "---|" * len(tiers) + "---|"]
        match = {t: 0 for t in tiers}
        for e in out["modules"]:
            b = e["bare"]
            notes = []
            for t in tiers:
                match[t] += _final(b)["ok"] == _final(e[t])["ok"]
                names = _newly_failing(b, e[t])
                if names:
                    notes.append(f"{t}: {names}")
            cells = " | ".join(_cell(e[t]) for t in tiers)
            lines.append(f"| {e['module']} | {_cell(b)} | {cells} | {'; '.join(notes)} |")
        lines.append("")
        for t in tiers:
            lines.append(f"modules matching bare ({t}): {match[t]}/{len(out['modules'])}")
    if out["jobs"]:
        lines += ["", "| job | expected | bare | " + " | ".join(tiers) + " |",
                  "|---|---|---|" + "---|" * len(tiers)]
        for e in out["jobs"]:
            cells = [("pass" if e[m]["ok"] else "FAIL: `" + e[m]["got"] + "`") + f" {e[m]['seconds']:.0f}s"
                     for m in ["bare"] + tiers]
            lines.append(f"| {e['job']} | `{e['bare']['expected']}` | " + " | ".join(cells) + " |")
        lines.append("")
        for t in tiers:
            n = sum(e["bare"]["ok"] == e[t]["ok"] for e in out["jobs"])
            lines.append(f"jobs matching bare ({t}): {n}/{len(out['jobs'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
