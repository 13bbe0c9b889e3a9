"""Tests of the session agent (agent.py), driven over its JSON-lines protocol.

Run: cd crates/kennel-server/src/agent && /usr/bin/python3 -m unittest test_agent -v

Outside a sandbox /workspace does not exist, so the tests work under a fresh /tmp directory,
which is also the agent's cwd (and so the kernel's and the default exec cwd).
"""

import base64
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")
FINAL_EVENTS = {"result", "ok", "file", "entries", "pong", "error", "started", "procs",
                "proc_output", "watching", "watch_events"}


def b64(data):
    return base64.b64encode(data).decode("ascii")


def process_gone(pid):
    """Whether pid no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid, within=2.0):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if process_gone(pid):
            return True
        time.sleep(0.02)
    return False


class AgentProcess:
    """The agent as a subprocess, with a thread turning its stdout into a queue of events."""

    def __init__(self, cwd, flags=(), env=None, wrapper=()):
        """The agent in cwd, with python's ``flags``, an ``env`` of the test's (default the
        test's own), under a ``wrapper`` command (such as ``unshare ...``)."""
        self.proc = subprocess.Popen(
            [*wrapper, "/usr/bin/python3", *flags, "-u", AGENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=cwd,
            env=env,
        )
        self.events = queue.Queue()
        self.next_id = 1
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(line)
        self.events.put(None)

    def send_raw(self, line):
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def next_event(self, timeout=10):
        line = self.events.get(timeout=timeout)
        if line is None:
            raise EOFError("the agent closed its stdout")
        assert line.endswith(b"\n"), line
        return json.loads(line)

    def call(self, request, timeout=10):
        """Sends a request; returns (events before the final one, the final event)."""
        rid = self.next_id
        self.next_id += 1
        self.send_raw(json.dumps({**request, "id": rid}).encode() + b"\n")
        events = []
        while True:
            event = self.next_event(timeout)
            if event["id"] != rid:
                raise AssertionError(f"unexpected event {event}")
            if event["event"] in FINAL_EVENTS:
                return events, event
            events.append(event)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class AgentCase(unittest.TestCase):
    """A fresh agent per test, working in a fresh directory (test_rich.py's tests too)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kennel-agent-test-", dir="/tmp")
        self.agent = AgentProcess(self.dir)
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.addCleanup(self.agent.close)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)


class AgentTest(AgentCase):
    # --- helpers

    def exec(self, kind, text, timeout_ms=5000, output_limit=1 << 20, **extra):
        request = {"op": "exec", "kind": kind, "timeout_ms": timeout_ms, "output_limit": output_limit}
        request.update(extra)
        if kind == "shell":
            request["command"] = text
            request.setdefault("cwd", self.dir)  # None: the session's own
        else:
            request.update(code=text)
        events, result = self.agent.call(request, timeout=timeout_ms / 1000 + 10)
        self.assertEqual(result["event"], "result", result)
        out = b"".join(base64.b64decode(e["b64"]) for e in events if e["event"] == "stdout")
        err = b"".join(base64.b64decode(e["b64"]) for e in events if e["event"] == "stderr")
        return result, out, err

    def shell(self, command, **kw):
        return self.exec("shell", command, **kw)

    def python(self, code, **kw):
        return self.exec("python", code, **kw)

    def kernel_pid(self):
        return self.agent.call({"op": "ping"})[1]["kernel_pid"]

    # --- shell

    def test_shell_output_and_exit_code(self):
        result, out, err = self.shell("echo hello; exit 3")
        self.assertEqual(out, b"hello\n")
        self.assertEqual(err, b"")
        self.assertEqual(result["exit_code"], 3)
        self.assertIsNone(result["signal"])
        self.assertFalse(result["timed_out"])
        self.assertIsNone(result["interpreter"])
        self.assertEqual(result["stdout_bytes"], 6)

    def test_shell_stdout_stderr_separation(self):
        result, out, err = self.shell("echo out; echo err >&2; echo out2", shell="sh")
        self.assertEqual(out, b"out\nout2\n")
        self.assertEqual(err, b"err\n")
        self.assertEqual(result["exit_code"], 0)

    def test_shell_env_cwd_and_default_cwd(self):
        _, out, _ = self.shell('echo "$FOO"; pwd', env={"FOO": "bar baz"})
        self.assertEqual(out, f"bar baz\n{self.dir}\n".encode())
        request = {"op": "exec", "kind": "shell", "command": "pwd", "timeout_ms": 5000, "output_limit": 100}
        events, result = self.agent.call(request)
        self.assertEqual(base64.b64decode(events[0]["b64"]), f"{self.dir}\n".encode())

    def test_shell_output_limit_exact_counts(self):
        result, out, err = self.shell("head -c 1000000 /dev/zero; echo -n abc >&2", output_limit=1000)
        self.assertEqual(out, b"\0" * 1000)
        self.assertEqual(result["stdout_bytes"], 1000000)
        self.assertTrue(result["stdout_truncated"])
        self.assertEqual(err, b"abc")
        self.assertEqual(result["stderr_bytes"], 3)
        self.assertFalse(result["stderr_truncated"])

    def test_shell_output_streams_before_the_end(self):
        self.agent.send_raw(
            json.dumps(
                {"op": "exec", "id": 99, "kind": "shell", "command": "echo first; sleep 0.5; echo second",
                 "timeout_ms": 5000, "output_limit": 100, "cwd": self.dir}
            ).encode() + b"\n"
        )
        first = self.agent.next_event()
        got_first = time.monotonic()
        self.assertEqual((first["event"], base64.b64decode(first["b64"])), ("stdout", b"first\n"))
        while (event := self.agent.next_event())["event"] != "result":
            pass
        self.assertGreater(time.monotonic() - got_first, 0.3)

    def test_shell_timeout_kills_background_child(self):
        pidfile = self.path("bg.pid")
        start = time.monotonic()
        result, _, _ = self.shell(f"sleep 30 & echo $! > {pidfile}; sleep 30", timeout_ms=300)
        self.assertLess(time.monotonic() - start, 2)
        self.assertTrue(result["timed_out"])
        self.assertIsNone(result["exit_code"])
        self.assertEqual(result["signal"], signal.SIGKILL)
        with open(pidfile) as f:
            self.assertTrue(wait_gone(int(f.read())))

    def test_shell_background_job_killed_at_exit(self):
        start = time.monotonic()
        result, out, _ = self.shell("sleep 30 & echo $!")
        self.assertLess(time.monotonic() - start, 1)
        self.assertEqual(result["exit_code"], 0)
        self.assertTrue(wait_gone(int(out)))

    def test_shell_escaped_descendant_does_not_hang(self):
        start = time.monotonic()
        result, out, _ = self.shell("setsid sleep 5 & sleep 0.1; echo $!")
        elapsed = time.monotonic() - start
        pid = int(out)
        try:
            self.assertEqual(result["exit_code"], 0)
            self.assertGreaterEqual(elapsed, 0.3)  # waited for EOF the 200 ms grace, no more
            self.assertLess(elapsed, 1)
            self.assertFalse(process_gone(pid))  # it left the group, so it was not killed
        finally:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def test_shell_stdin(self):
        _, out, _ = self.shell("cat; echo", stdin_b64=b64(b"abc"))
        self.assertEqual(out, b"abc\n")
        big = os.urandom(1 << 20)
        _, out, _ = self.shell("wc -c", stdin_b64=b64(big))
        self.assertEqual(out.strip(), b"1048576")
        result, out, _ = self.shell("head -c 3", stdin_b64=b64(big))  # closes stdin early
        self.assertEqual((result["exit_code"], out), (0, big[:3]))
        _, out, _ = self.shell("cat")  # no stdin: /dev/null
        self.assertEqual(out, b"")

    def test_shell_gets_no_extra_fds(self):
        _, out, _ = self.shell("ls /proc/$$/fd; true")
        self.assertEqual(out.split(), [b"0", b"1", b"2"])

    def test_shell_spawn_failure(self):
        request = {"op": "exec", "kind": "shell", "command": "true", "timeout_ms": 1000, "output_limit": 10,
                   "cwd": self.path("missing")}
        _, answer = self.agent.call(request)
        self.assertEqual((answer["event"], answer["errno"]), ("error", "ENOENT"))

    # --- a shell session keeps its cwd and exports, as a terminal does

    def test_cd_and_export_hold_in_the_next_shell_exec(self):
        sub = self.path("sub")
        os.mkdir(sub)
        self.shell(f"cd {sub}; export KEPT=1; NOT_EXPORTED=2; export GONE=3", cwd=None)
        _, out, _ = self.shell("pwd; echo $KEPT-$NOT_EXPORTED-$GONE; unset GONE", cwd=None)
        self.assertEqual(out, f"{sub}\n1--3\n".encode())
        _, out, _ = self.shell('echo "${GONE-unset}"', cwd=None, shell="sh")
        self.assertEqual(out, b"unset\n", "sh shares the state")
        levels = {self.shell("echo $SHLVL", cwd=None)[1] for _ in range(2)}
        self.assertEqual(len(levels), 1, "each shell starts at the same level")

    def test_an_exit_keeps_the_state_and_a_kill_keeps_the_last(self):
        result, _, _ = self.shell(f"cd {self.dir}; export A=1; exit 3", cwd=None)
        self.assertEqual(result["exit_code"], 3)
        result, _, _ = self.shell("cd /; export A=2; sleep 30", cwd=None, timeout_ms=300)
        self.assertTrue(result["timed_out"])
        _, out, _ = self.shell("pwd; echo $A", cwd=None)
        self.assertEqual(out, f"{self.dir}\n1\n".encode())

    def test_a_one_shot_shell_exec_is_the_bare_command(self):
        _, out, _ = self.shell("trap -p; cd /; export GONE=1", one_shot=True, cwd=None)
        self.assertEqual(out, b"", "no EXIT trap of the agent's")
        _, out, _ = self.shell('pwd; echo "${GONE-unset}"', cwd=None)
        self.assertEqual(out, f"{self.dir}\nunset\n".encode(), "and no state kept")

    def test_a_shell_exec_sees_no_state_pipe(self):
        _, out, _ = self.shell("ls /proc/self/fd", cwd=None)
        self.assertEqual(out.split(), [b"0", b"1", b"2", b"3"])  # 3: ls's own directory

    # --- interrupt and cancel, while an exec runs

    def start(self, request):
        """Sends a request without waiting; returns its id."""
        rid = self.agent.next_id
        self.agent.next_id += 1
        self.agent.send_raw(json.dumps({**request, "id": rid}).encode() + b"\n")
        return rid

    def finals(self, count, timeout=15):
        """The next count final events, in order, by id (output events are skipped)."""
        got = []
        while len(got) < count:
            event = self.agent.next_event(timeout)
            if event["event"] in FINAL_EVENTS:
                got.append(event)
        return got

    def test_interrupt_raises_keyboard_interrupt_and_keeps_the_session(self):
        self.python("kept = 7")
        code = "import time\ntry:\n    time.sleep(30)\nfinally:\n    print('cleaned')"
        run = self.start({"op": "exec", "kind": "python", "code": code, "timeout_ms": 20000,
                          "output_limit": 1000})
        time.sleep(0.3)
        stop = self.start({"op": "interrupt"})
        started = time.monotonic()
        ok, result = self.finals(2)
        self.assertEqual((ok["id"], ok["event"]), (stop, "ok"))
        self.assertEqual(result["id"], run)
        self.assertLess(time.monotonic() - started, 2)
        self.assertEqual((result["exit_code"], result["timed_out"]), (1, False))
        self.assertEqual(result["error"]["name"], "KeyboardInterrupt")
        self.assertFalse(result["interpreter"]["restarted"])
        _, out, _ = self.python("print(kept)")
        self.assertEqual(out, b"7\n")

    def test_interrupt_sends_sigint_to_a_shell_command(self):
        run = self.start({"op": "exec", "kind": "shell", "command": "trap 'echo got INT; exit 9' INT; sleep 30 & wait",
                          "timeout_ms": 20000, "output_limit": 1000, "cwd": self.dir})
        time.sleep(0.3)
        self.start({"op": "interrupt"})
        _, result = self.finals(2)
        self.assertEqual((result["id"], result["exit_code"]), (run, 9))

    def test_cancel_ends_the_exec_now_and_requests_meanwhile_wait_their_turn(self):
        run = self.start({"op": "exec", "kind": "python", "code": "import time\nwhile True: time.sleep(0.01)",
                          "timeout_ms": 30000, "output_limit": 1000})
        time.sleep(0.3)
        ping = self.start({"op": "ping"})
        cancel = self.start({"op": "cancel"})
        started = time.monotonic()
        ok, result, pong = self.finals(3)
        self.assertEqual([e["id"] for e in (ok, result, pong)], [cancel, run, ping])
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual((result["cancelled"], result["timed_out"]), (True, False))
        self.assertEqual(pong["event"], "pong")

    def test_a_cancel_read_with_its_exec_still_cancels_it(self):
        # Both lines in one write: the agent reads them in one go, and poll never tells it of
        # the second.
        rid = self.agent.next_id
        self.agent.next_id += 2
        run = {"op": "exec", "id": rid, "kind": "python", "code": "import time\ntime.sleep(30)",
               "timeout_ms": 60000, "output_limit": 1000}
        cancel = {"op": "cancel", "id": rid + 1, "target": rid}
        started = time.monotonic()
        self.agent.send_raw((json.dumps(run) + "\n" + json.dumps(cancel) + "\n").encode())
        results = {e["id"]: e for e in self.finals(2)}
        self.assertLess(time.monotonic() - started, 5)
        self.assertTrue(results[rid]["cancelled"])

    def test_a_cancel_for_another_exec_is_ignored(self):
        run = self.start({"op": "exec", "kind": "python", "code": "import time\ntime.sleep(1)\nprint('whole')",
                          "timeout_ms": 10000, "output_limit": 1000})
        time.sleep(0.3)
        self.start({"op": "cancel", "target": run - 1})
        _, result = self.finals(2)
        self.assertEqual((result["id"], result["exit_code"], result["cancelled"]), (run, 0, False))
        run = self.start({"op": "exec", "kind": "shell", "command": "sleep 10", "cwd": self.dir,
                          "timeout_ms": 10000, "output_limit": 1000})
        time.sleep(0.3)
        self.start({"op": "cancel", "target": run})
        _, result = self.finals(2)
        self.assertEqual((result["id"], result["cancelled"], result["timed_out"]), (run, True, False))

    def test_interrupt_and_cancel_between_execs_do_nothing(self):
        for op in ("interrupt", "cancel"):
            self.assertEqual(self.agent.call({"op": op})[1]["event"], "ok")
        _, out, _ = self.python("print(1)")
        self.assertEqual(out, b"1\n")

    # --- python

    def test_python_state_persists(self):
        result, out, _ = self.python("x = 1\ndef f(): return x + 1\nimport json")
        self.assertEqual(result["exit_code"], 0)
        self.assertEqual(result["interpreter"], {"restarted": False, "crashed": False, "reason": None})
        result, out, _ = self.python("print(x, f(), json.dumps([1]), __name__)")
        self.assertEqual(out, b"1 2 [1] __main__\n")

    def test_python_exec_reports_its_own_usage(self):
        # The kernel's CPU over this exec alone (a busy 0.3 s, the exec before it idle) and a
        # peak that covers the 64 MiB the code held; none for a kernel that died first.
        self.python("import time")
        busy = "b = bytearray(64 << 20)\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
        result, _, _ = self.python(busy)
        usage = result["usage"]
        self.assertGreaterEqual(usage["cpu_ns"], 300_000_000, usage)
        self.assertLess(usage["cpu_ns"], 3_000_000_000, usage)
        self.assertGreaterEqual(usage["max_rss_bytes"], 64 << 20, usage)
        result, _, _ = self.python("pass")
        self.assertLess(result["usage"]["cpu_ns"], 300_000_000, result)
        result, _, _ = self.python("import os\nos._exit(7)")
        self.assertIsNone(result["usage"], result)

    def test_a_one_shot_exec_gets_freshly_seeded_generators(self):
        # A microVM clone's kernel was started before its snapshot: its generators are the
        # snapshot's until a one-shot exec seeds them again. A session exec keeps them.
        self.python("import random\nrandom.seed(5)")
        _, kept, _ = self.python("print(random.random())")
        self.python("random.seed(5)")
        _, fresh, _ = self.python("import random\nprint(random.random())", one_shot=True)
        self.assertEqual(float(kept), __import__("random").Random(5).random())
        self.assertNotEqual(float(fresh), float(kept))

    def test_a_reseed_reaches_the_next_python_exec_once_even_by_a_shell_exec(self):
        # The first exec after a resume carries "reseed": every kernel's generators are seeded
        # afresh before its next python exec, and only that one.
        draws = "print(random.random())\nrandom.seed(5)"
        self.python("import random\nrandom.seed(5)")
        _, kept, _ = self.python(draws)
        self.shell("true", reseed=True)
        _, fresh, _ = self.python(draws)
        _, again, _ = self.python(draws)
        first = __import__("random").Random(5).random()
        self.assertEqual((float(kept), float(again)), (first, first))
        self.assertNotEqual(float(fresh), first)

    def test_python_exception(self):
        result, out, err = self.python("print('before')\ndef g():\n    1/0\ng()")
        self.assertEqual(result["exit_code"], 1)
        self.assertEqual(out, b"before\n")
        text = err.decode()
        self.assertTrue(text.startswith("Traceback (most recent call last):\n"), text)
        self.assertIn('File "<session>", line 4, in <module>', text)
        self.assertIn("ZeroDivisionError: division by zero", text)
        self.assertNotIn("agent", text)
        result, _, err = self.python("x = (")
        self.assertEqual(result["exit_code"], 1)
        self.assertIn(b"SyntaxError", err)

    def test_python_system_exit(self):
        result, _, _ = self.python("y = 5\nraise SystemExit(3)")
        self.assertEqual(result["exit_code"], 3)
        self.assertFalse(result["interpreter"]["restarted"])
        result, out, _ = self.python("print(y)")
        self.assertEqual((result["exit_code"], out), (0, b"5\n"))
        result, _, err = self.python("import sys; sys.exit('bye')")
        self.assertEqual((result["exit_code"], err), (1, b"bye\n"))
        result, _, _ = self.python("exit()")
        self.assertEqual(result["exit_code"], 0)

    def test_python_timeout_keeps_state(self):
        self.python("x = 41")
        start = time.monotonic()
        result, _, err = self.python("while True: pass", timeout_ms=300)
        self.assertLess(time.monotonic() - start, 1.5)
        self.assertTrue(result["timed_out"])
        self.assertIsNone(result["exit_code"])
        self.assertIsNone(result["signal"])
        self.assertFalse(result["interpreter"]["restarted"])
        self.assertTrue(err.endswith(b"KeyboardInterrupt\n"), err)
        result, out, _ = self.python("print(x + 1)")
        self.assertEqual((result["exit_code"], result["timed_out"], out), (0, False, b"42\n"))

    def test_python_crash_restarts(self):
        self.python("x = 1")
        old = self.kernel_pid()
        result, out, _ = self.python("import os\nprint('bye', flush=True)\nos._exit(7)")
        self.assertEqual(out, b"bye\n")
        self.assertEqual((result["exit_code"], result["signal"]), (7, None))
        interp = result["interpreter"]
        self.assertTrue(interp["crashed"] and interp["restarted"], interp)
        self.assertIn("exited with code 7", interp["reason"])
        new = self.kernel_pid()
        self.assertIsNotNone(new)
        self.assertNotEqual(new, old)
        result, out, _ = self.python("print('x' in dir())")
        self.assertEqual((result["exit_code"], out), (0, b"False\n"))
        self.assertFalse(result["interpreter"]["restarted"])

    def test_python_segfault(self):
        result, _, _ = self.python("import ctypes; ctypes.string_at(0)")
        self.assertEqual(result["signal"], signal.SIGSEGV)
        self.assertIsNone(result["exit_code"])
        self.assertTrue(result["interpreter"]["crashed"])
        result, out, _ = self.python("print(1)")
        self.assertEqual(out, b"1\n")

    def test_python_kernel_killed_between_execs(self):
        os.kill(self.kernel_pid(), signal.SIGKILL)
        time.sleep(0.1)
        result, out, _ = self.python("print('fresh')")
        self.assertEqual((result["exit_code"], out), (0, b"fresh\n"))
        self.assertTrue(result["interpreter"]["restarted"] and result["interpreter"]["crashed"])
        self.assertIn("between execs", result["interpreter"]["reason"])

    def test_python_ignoring_sigint_is_killed_and_restarted(self):
        self.python("x = 1")
        start = time.monotonic()
        code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
        result, _, _ = self.python(code, timeout_ms=200)
        self.assertLess(time.monotonic() - start, 4)
        self.assertTrue(result["timed_out"])
        self.assertEqual(result["signal"], signal.SIGKILL)
        interp = result["interpreter"]
        self.assertTrue(interp["restarted"])
        self.assertFalse(interp["crashed"])
        self.assertIn("SIGINT", interp["reason"])
        result, out, _ = self.python("print('x' in dir())")
        self.assertEqual(out, b"False\n")

    def test_python_stdin(self):
        _, out, _ = self.python("import sys\nprint(sys.stdin.read().upper())", stdin_b64=b64(b"abc"))
        self.assertEqual(out, b"ABC\n")
        _, out, _ = self.python("print(repr(sys.stdin.read()))")
        self.assertEqual(out, b"''\n")
        _, out, _ = self.python("print(input())", stdin_b64=b64(b"line\nrest"))
        self.assertEqual(out, b"line\n")

    def test_python_fd_level_output(self):
        code = "import os, sys, subprocess\nprint('p')\nsys.stderr.write('e\\n')\nos.write(1, b'raw\\n')\n"
        code += "os.system('echo hi; echo ho >&2')\nsubprocess.run(['echo', 'sub'])\nprint('end', end='')"
        result, out, err = self.python(code)
        self.assertEqual(out, b"p\nraw\nhi\nsub\nend")
        self.assertEqual(err, b"e\nho\n")
        self.assertEqual(result["stdout_bytes"], len(out))

    def test_python_output_limit(self):
        result, out, _ = self.python("import sys; sys.stdout.write('x' * 1000000)", output_limit=1000)
        self.assertEqual(out, b"x" * 1000)
        self.assertEqual((result["stdout_bytes"], result["stdout_truncated"]), (1000000, True))

    def test_python_survives_closed_stdout(self):
        self.python("import sys; sys.stdout.close()")
        _, out, _ = self.python("print('back')")
        self.assertEqual(out, b"back\n")

    def test_kernel_holds_no_agent_fds(self):
        self.python("pass")  # the kernel has finished setting itself up
        pid = self.kernel_pid()
        agent_fds = {os.readlink(f"/proc/{self.agent.proc.pid}/fd/{n}") for n in (0, 1)}
        links = {n: os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
        self.assertFalse(agent_fds & set(links.values()), links)
        self.assertEqual({links[n] for n in ("0", "1", "2")}, {"/dev/null"})
        others = [v for n, v in links.items() if n not in ("0", "1", "2")]
        self.assertEqual(len(others), 1, links)
        self.assertTrue(others[0].startswith("socket:"), links)
        # Code that writes a protocol line to "stdout" only produces output.
        line = b'{"id":1,"event":"pong"}\n'
        _, out, _ = self.python(f"import os; os.write(1, {line!r})")
        self.assertEqual(out, line)

    # --- files

    def test_file_round_trip(self):
        path = self.path("a", "b.txt")
        _, answer = self.agent.call({"op": "write", "path": path, "b64": b64(b"hello\n"), "mode": 0o600})
        self.assertEqual(answer["event"], "ok", answer)
        self.assertEqual(answer["size"], 6)
        self.assertEqual(os.stat(path).st_mode & 0o7777, 0o600)
        _, answer = self.agent.call({"op": "read", "path": path, "max_bytes": 100})
        self.assertEqual((answer["event"], answer["size"], answer["truncated"]), ("file", 6, False))
        self.assertEqual(base64.b64decode(answer["b64"]), b"hello\n")
        _, answer = self.agent.call({"op": "read", "path": path, "max_bytes": 2})
        self.assertEqual((answer["size"], answer["truncated"]), (6, True))
        self.assertEqual(base64.b64decode(answer["b64"]), b"he")
        self.agent.call({"op": "write", "path": self.path("a", "c"), "b64": b64(b"x" * 10), "mode": 0o755})
        os.symlink("b.txt", self.path("a", "link"))
        os.mkdir(self.path("a", "sub"))
        sub = os.stat(self.path("a", "sub"))
        _, answer = self.agent.call({"op": "list", "path": self.path("a")})
        self.assertEqual(
            answer["entries"],
            [
                {"name": "b.txt", "type": "file", "size": 6, "mode": 0o600},
                {"name": "c", "type": "file", "size": 10, "mode": 0o755},
                {"name": "link", "type": "symlink", "size": 5, "mode": 0o777},
                {"name": "sub", "type": "dir", "size": sub.st_size, "mode": sub.st_mode & 0o7777},
            ],
        )
        _, answer = self.agent.call({"op": "delete", "path": self.path("a")})
        self.assertEqual(answer, {"id": answer["id"], "event": "ok"})
        self.assertFalse(os.path.exists(self.path("a")))
        _, answer = self.agent.call({"op": "list", "path": self.path("a")})
        self.assertEqual((answer["event"], answer["errno"]), ("error", "ENOENT"))
        _, answer = self.agent.call({"op": "list", "path": "/tmp"})
        self.assertIn(os.path.basename(self.dir), [e["name"] for e in answer["entries"]])

    def test_write_refuses_a_symlink_instead_of_following_it(self):
        target = self.path("target")
        with open(target, "w") as f:
            f.write("keep")
        os.symlink(target, self.path("link"))
        _, answer = self.agent.call({"op": "write", "path": self.path("link"), "b64": b64(b"new"), "mode": 0o644})
        self.assertEqual((answer["event"], answer["errno"]), ("error", "ELOOP"), answer)
        self.assertIn("symlink", answer["message"])
        with open(target) as f:
            self.assertEqual(f.read(), "keep")
        self.assertTrue(os.path.islink(self.path("link")))
        self.assertEqual(sorted(os.listdir(self.dir)), ["link", "target"])

    def test_no_op_passes_through_a_symlinked_directory(self):
        # The native tier's collect refuses a path through a symlink (openat2
        # RESOLVE_NO_SYMLINKS); every file op here does the same, wherever the link points.
        os.mkdir(self.path("real"))
        with open(self.path("real", "f"), "w") as f:
            f.write("inside")
        os.symlink(self.path("real"), self.path("dlink"))
        os.symlink("/", self.path("root"))
        os.symlink("/etc", self.path("etc"))
        # This runs on the host: writes and deletes go only through the link to our own
        # directory, never through the links to / and /etc.
        through = [(self.path("dlink", "f"), True)]
        through += [(self.path("root", "etc", "hostname"), False), (self.path("etc", "hostname"), False)]
        for path, writable in through:
            requests = [{"op": "read", "path": path, "max_bytes": 10}, {"op": "list", "path": os.path.dirname(path)}]
            if writable:
                requests += [
                    {"op": "write", "path": path, "b64": b64(b"x")},
                    {"op": "write", "path": path + "-new", "b64": b64(b"x")},
                    {"op": "delete", "path": path},
                ]
            for request in requests:
                _, answer = self.agent.call(request)
                self.assertEqual((answer["event"], answer["errno"]), ("error", "ELOOP"), (request, answer))
                self.assertEqual(answer["message"], "is or passes through a symlink; not followed")
        for name in ("dlink", "root", "etc"):
            _, answer = self.agent.call({"op": "list", "path": self.path(name)})
            self.assertEqual(answer["errno"], "ELOOP", (name, answer))
        with open(self.path("real", "f")) as f:
            self.assertEqual(f.read(), "inside")
        self.assertEqual(os.listdir(self.path("real")), ["f"])
        # A symlink itself can be deleted; what it points to stays.
        _, answer = self.agent.call({"op": "delete", "path": self.path("dlink")})
        self.assertEqual(answer["event"], "ok", answer)
        self.assertFalse(os.path.lexists(self.path("dlink")))
        self.assertTrue(os.path.isfile(self.path("real", "f")))
        # A file where a directory is expected is ENOTDIR, not followed or made.
        _, answer = self.agent.call({"op": "write", "path": self.path("real", "f", "g"), "b64": b64(b"x")})
        self.assertEqual(answer["errno"], "ENOTDIR", answer)

    def test_read_refuses_symlinks_fifos_and_directories(self):
        with open(self.path("real"), "w") as f:
            f.write("secret")
        os.symlink(self.path("real"), self.path("link"))
        os.mkfifo(self.path("fifo"))
        for name, expected in (("link", "ELOOP"), ("fifo", "EINVAL"), ("", "EISDIR"), ("nope", "ENOENT")):
            _, answer = self.agent.call({"op": "read", "path": self.path(name), "max_bytes": 10}, timeout=3)
            self.assertEqual((answer["event"], answer["errno"]), ("error", expected), name)

    def test_paths_outside_roots_refused(self):
        for path in ("/etc/passwd", "relative/x", "/tmp/../etc/passwd", "/tmp", "/workspacex/a", "//tmp/a"):
            _, answer = self.agent.call({"op": "read", "path": path, "max_bytes": 10})
            self.assertEqual(answer["event"], "error", path)
            self.assertEqual(answer["errno"], "EINVAL", path)
            self.assertEqual(answer["message"], "path must be under /workspace or /tmp")
        _, answer = self.agent.call({"op": "list", "path": "/etc"})
        self.assertEqual(answer["errno"], "EINVAL")
        _, answer = self.agent.call({"op": "delete", "path": "/tmp"})
        self.assertEqual(answer["errno"], "EINVAL")
        _, answer = self.agent.call({"op": "read", "path": "/tmp/a\0b", "max_bytes": 1})
        self.assertEqual(answer["errno"], "EINVAL")

    # --- protocol

    def test_malformed_lines_answered(self):
        bad = [
            (b"not json\n", None),
            (b"[1, 2]\n", None),
            (b'{"op": "ping"}\n', None),
            (b'{"id": "7", "op": "ping"}\n', None),
            (b'{"id": true, "op": "ping"}\n', None),
            (b'{"id": 5, "op": "nope"}\n', 5),
            (b'{"id": 6, "op": ["x"]}\n', 6),
            (b'{"id": 7, "op": "read", "max_bytes": 1}\n', 7),
            (b'{"id": 8, "op": "exec", "kind": "shell", "command": 1, "timeout_ms": 1,'
             b' "output_limit": 1}\n', 8),
            (b'{"id": 9, "op": "exec", "kind": "shell", "command": "true", "timeout_ms": -1,'
             b' "output_limit": 1}\n', 9),
            (b'{"id": 10, "op": "write", "path": "/tmp/x", "b64": "***"}\n', 10),
            (b'{"id": 11, "op": "exec", "kind": "ruby", "code": ""}\n', 11),
            (b"\xff\xfe\n", None),
            (b"[" * 100000 + b"\n", None),
        ]
        for line, rid in bad:
            self.agent.send_raw(line)
            answer = self.agent.next_event()
            got = (answer["id"], answer["event"], answer["errno"])
            self.assertEqual(got, (rid, "error", "EINVAL"), line[:60])
        self.agent.send_raw(b"\n  \n")  # blank lines are ignored
        _, answer = self.agent.call({"op": "ping"})
        self.assertEqual(answer["event"], "pong")
        self.assertEqual(answer["pid"], self.agent.proc.pid)
        self.assertIsInstance(answer["kernel_pid"], int)

    def test_stdin_eof_exits_promptly(self):
        kernel = self.kernel_pid()
        start = time.monotonic()
        self.agent.proc.stdin.close()
        self.assertEqual(self.agent.proc.wait(timeout=1), 0)
        self.assertLess(time.monotonic() - start, 1)
        self.assertTrue(wait_gone(kernel, 1))


class LeanStartTest(unittest.TestCase):
    """A pooled sandbox pays for every module its agent imports before its one run, and the
    run's code finds them in sys.modules. The agent keeps to the C modules beneath json,
    base64, socket and signal, whose Python layers import re and enum. Started without site
    (-S), which on some hosts imports re and enum by itself (this one's .pth files do)."""

    AVOIDED = ("base64", "enum", "json", "re", "selectors", "signal", "socket", "struct")

    def loaded(self, flags):
        cwd = tempfile.mkdtemp(prefix="kennel-agent-test-", dir="/tmp")
        self.addCleanup(shutil.rmtree, cwd, True)
        agent = AgentProcess(cwd, flags)
        self.addCleanup(agent.close)
        code = f"import sys; print(' '.join(m for m in {self.AVOIDED!r} if m in sys.modules))"
        request = {"op": "exec", "kind": "python", "code": code, "timeout_ms": 5000,
                   "output_limit": 4096, "one_shot": True}
        events, result = agent.call(request)
        self.assertEqual(result["exit_code"], 0, (events, result))
        out = b"".join(base64.b64decode(e["b64"]) for e in events if e["event"] == "stdout")
        return out.decode().split()

    def test_its_codecs_answer_as_json_and_base64_do(self):
        import importlib.util

        spec = importlib.util.spec_from_file_location("kennel_agent", AGENT)
        agent = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(agent)
        texts = ['{"id":1,"op":"ping"}', ' \t[1, 2.5e3, -0, "\\u00e9\\ud800", null, true]\r\n',
                 '{"a":{"b":[{}]}}', "NaN", "-Infinity", '"x"', "1e400", "", " ", "{", '{"a":1}x',
                 '{"a":1} {"b":2}', "\ufeff{}", "[1,]", '{"a" 1}', '"\x01"', "01", "[" * 100000]
        for text in texts + [t.encode() for t in texts] + [b"\xef\xbb\xbf{}", b"\xed\xa0\x80"]:
            try:
                want = ("value", json.loads(text))
            except (ValueError, RecursionError) as exc:
                want = ("error", type(exc), str(exc))
            try:
                got = ("value", agent.json_loads(text))
            except (ValueError, RecursionError) as exc:
                got = ("error", type(exc), str(exc))
            self.assertEqual(repr(got), repr(want), text[:40])
        for value in [{"id": 1, "event": "result", "exit_code": None, "usage": {"cpu_ns": 3}},
                      ["\u00e9\ud800\n", 1.5, -0.0, float("inf"), 10**30, True, {}]]:
            self.assertEqual(agent.json_dumps(value), json.dumps(value, separators=(",", ":")))
        with self.assertRaisesRegex(TypeError, "not JSON serializable"):
            agent.json_dumps({"a": object()})
        for text in ["eA==", "", "eA", "eA===", "e A==", "eA==\n", "é", "////", "eA=x"]:
            try:
                want = base64.b64decode(text, validate=True)
            except ValueError:
                want = ValueError
            try:
                got = agent.b64decode(text)
            except ValueError:
                got = ValueError
            self.assertEqual(got, want, text)

    def test_the_agent_starts_without_the_modules_a_bare_interpreter_lacks(self):
        bare = subprocess.run(["/usr/bin/python3", "-S", "-c", "import sys; print(' '.join("
                               f"m for m in {self.AVOIDED!r} if m in sys.modules))"],
                              capture_output=True, check=True).stdout.decode().split()
        self.assertEqual(bare, [], "a bare interpreter without site imports none of them")
        self.assertEqual(self.loaded(["-S"]), [])


if __name__ == "__main__":
    unittest.main()
