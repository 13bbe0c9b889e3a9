"""The agent's background processes (procs.py): started, listed, read by offset, fed, signalled
and killed, and served while an exec runs. Run with ``python3 -m unittest test_procs``."""

import base64
import os
import signal
import time
import unittest

from test_agent import AgentCase


def b64(data):
    return base64.b64encode(data).decode()


class ProcsTest(AgentCase):
    def start(self, argv, **extra):
        _, started = self.agent.call({"op": "start", "argv": argv, "max_processes": 4, **extra})
        self.assertEqual(started["event"], "started", started)
        return started

    def read(self, pid, out=0, err=0, limit=1 << 20):
        _, answer = self.agent.call({"op": "proc_read", "pid": pid, "stdout_offset": out,
                                     "stderr_offset": err, "max_bytes": limit})
        self.assertEqual(answer["event"], "proc_output", answer)
        return answer

    def until_ended(self, pid):
        end = time.monotonic() + 10
        while time.monotonic() < end:
            answer = self.read(pid)
            if answer["ended"]:
                return answer
            time.sleep(0.02)
        self.fail(f"process {pid} did not end")

    def text(self, part):
        return base64.b64decode(part["b64"]).decode()

    def test_a_process_outlives_its_request_and_its_output_is_kept_with_offsets(self):
        started = self.start(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertIn(started["state"], ("running", "exited"), started)
        ended = self.until_ended(started["pid"])
        self.assertEqual(self.text(ended["stdout"]), "out\n")
        self.assertEqual(self.text(ended["stderr"]), "err\n")
        self.assertEqual(ended["process"]["exit_code"], 3)
        self.assertEqual(ended["process"]["stdout_bytes"], 4)
        later = self.read(started["pid"], out=2)
        self.assertEqual((later["stdout"]["offset"], self.text(later["stdout"])), (2, "t\n"))

    def test_a_process_runs_while_an_exec_does_and_while_idle(self):
        pid = self.start(["/bin/sh", "-c", "i=0; while [ $i -lt 5 ]; do echo $i; i=$((i+1)); "
                                           "sleep 0.1; done"])["pid"]
        _, result = self.agent.call({"op": "exec", "kind": "shell", "command": "sleep 0.3",
                                     "timeout_ms": 5000, "output_limit": 100})
        self.assertEqual(result["exit_code"], 0, result)
        ended = self.until_ended(pid)
        self.assertEqual(self.text(ended["stdout"]), "0\n1\n2\n3\n4\n")

    def test_process_requests_are_answered_during_an_exec(self):
        pid = self.start(["/bin/sleep", "30"])["pid"]
        rid = self.agent.next_id
        self.agent.send_raw(b'{"op":"exec","id":%d,"kind":"shell","command":"sleep 1",'
                            b'"timeout_ms":5000,"output_limit":100}\n' % rid)
        self.agent.next_id += 1
        _, listed = self.agent.call({"op": "procs"}, timeout=0.9)
        self.assertEqual([p["pid"] for p in listed["procs"]], [pid])
        self.assertEqual(listed["procs"][0]["state"], "running")
        self.assertEqual(self.agent.next_event()["event"], "result")

    def test_stdin_is_fed_and_closed(self):
        pid = self.start(["/bin/cat"], stdin=True)["pid"]
        _, ok = self.agent.call({"op": "proc_stdin", "pid": pid, "b64": b64(b"hello\n"),
                                 "eof": True})
        self.assertEqual(ok["event"], "ok", ok)
        self.assertEqual(self.text(self.until_ended(pid)["stdout"]), "hello\n")
        _, refused = self.agent.call({"op": "proc_stdin", "pid": pid, "b64": b64(b"x")})
        self.assertEqual(refused["errno"], "EPIPE", refused)

    def test_a_kill_ends_the_whole_group_and_a_signal_the_process(self):
        pid = self.start(["/bin/sh", "-c", "sleep 30 & echo $!; wait"])["pid"]
        time.sleep(0.2)
        child = int(self.text(self.read(pid)["stdout"]))
        self.agent.call({"op": "proc_kill", "pid": pid})
        ended = self.until_ended(pid)
        self.assertEqual(ended["process"]["signal"], signal.SIGKILL)
        end = time.monotonic() + 5
        while time.monotonic() < end and os.path.exists(f"/proc/{child}"):
            time.sleep(0.02)
        self.assertFalse(os.path.exists(f"/proc/{child}"), "the group's child lives on")
        term = self.start(["/bin/sleep", "30"])["pid"]
        self.agent.call({"op": "proc_signal", "pid": term, "signal": signal.SIGTERM})
        self.assertEqual(self.until_ended(term)["process"]["signal"], signal.SIGTERM)

    def test_only_its_own_processes_are_reached(self):
        self.start(["/bin/true"])
        _, pong = self.agent.call({"op": "ping"})
        for pid in (pong["pid"], pong["kernel_pid"], 1, os.getpid()):
            _, refused = self.agent.call({"op": "proc_kill", "pid": pid})
            self.assertEqual(refused["errno"], "ESRCH", (pid, refused))

    def test_a_timeout_kills_the_group_and_the_bound_is_kept(self):
        pid = self.start(["/bin/sleep", "30"], timeout_ms=200)["pid"]
        ended = self.until_ended(pid)
        self.assertEqual((ended["process"]["signal"], ended["process"]["timed_out"]), (9, True))
        for _ in range(4):
            self.start(["/bin/sleep", "30"])
        _, refused = self.agent.call({"op": "start", "argv": ["/bin/true"], "max_processes": 4})
        self.assertEqual(refused["errno"], "EAGAIN", refused)

    def test_a_reader_behind_the_ring_is_told_what_it_lost(self):
        pid = self.start(["/usr/bin/python3", "-c",
                          "import sys; sys.stdout.write('x' * (3 << 20))"])["pid"]
        ended = self.until_ended(pid)
        self.assertEqual(ended["process"]["stdout_bytes"], 3 << 20)
        self.assertEqual(ended["stdout"]["dropped"], 2 << 20)
        self.assertEqual(ended["stdout"]["offset"], 2 << 20)
        self.assertEqual(len(base64.b64decode(ended["stdout"]["b64"])), 1 << 20)

    def until_text(self, pid, wanted, out=0):
        """The stdout from out on, read until it holds wanted."""
        end, text = time.monotonic() + 10, ""
        while time.monotonic() < end and wanted not in text:
            text = self.text(self.read(pid, out=out)["stdout"])
            time.sleep(0.02)
        self.assertIn(wanted, text)
        return text

    def test_a_tty_process_runs_on_a_pty_it_controls_and_resizes(self):
        started = self.start(["/bin/sh", "-c", "stty size; tty; read x; echo got $x; stty size"],
                             tty={"cols": 80, "rows": 24})
        self.assertEqual((started["tty"], started["terminal"]), ({"cols": 80, "rows": 24}, False))
        pid = started["pid"]
        self.assertIn("24 80", self.until_text(pid, "/dev/pts/"))
        _, ok = self.agent.call({"op": "proc_resize", "pid": pid, "cols": 100, "rows": 30})
        self.assertEqual(ok["event"], "ok", ok)
        self.agent.call({"op": "proc_stdin", "pid": pid, "b64": b64(b"hi\n")})
        ended = self.until_ended(pid)
        text = self.text(ended["stdout"])
        # The pty echoes what is typed and turns each newline into CR LF.
        self.assertTrue(text.endswith("hi\r\ngot hi\r\n30 100\r\n"), text)
        self.assertEqual(ended["stderr"]["b64"], "")
        self.assertEqual(ended["process"]["tty"], {"cols": 100, "rows": 30})
        _, refused = self.agent.call({"op": "proc_resize", "pid": self.start(["/bin/true"])["pid"],
                                      "cols": 10, "rows": 10})
        self.assertEqual(refused["errno"], "ENOTTY", refused)

    def test_a_pty_ends_soon_after_its_process_though_a_job_holds_it(self):
        pid = self.start(["/bin/bash", "-c", "sleep 30 & echo bye"],
                         tty={"cols": 80, "rows": 24})["pid"]
        ended = self.until_ended(pid)
        self.assertEqual(self.text(ended["stdout"]), "bye\r\n")

    def test_terminals_are_counted_apart_from_processes(self):
        shell = {"argv": ["/bin/sh"], "tty": {"cols": 80, "rows": 24}, "terminal": True,
                 "max_terminals": 1}
        self.assertTrue(self.start(**shell)["terminal"])
        _, refused = self.agent.call({"op": "start", **shell, "max_processes": 4})
        self.assertEqual(refused["errno"], "EAGAIN", refused)
        self.start(["/bin/sleep", "30"])

    def test_a_read_that_waits_is_answered_when_output_comes(self):
        pid = self.start(["/bin/sh", "-c", "sleep 0.3; echo late"])["pid"]
        _, answer = self.agent.call({"op": "proc_read", "pid": pid, "stdout_offset": 0,
                                     "stderr_offset": 0, "max_bytes": 100, "wait_ms": 5000})
        self.assertEqual(self.text(answer["stdout"]), "late\n")
        ended = self.until_ended(pid)
        _, quiet = self.agent.call({"op": "proc_read", "pid": pid, "stdout_offset": 5,
                                    "stderr_offset": 0, "max_bytes": 100, "wait_ms": 5000})
        self.assertTrue(quiet["ended"], "an ended process is answered at once")
        _, tail = self.agent.call({"op": "proc_read", "pid": pid, "tail": 3,
                                   "max_bytes": 100})
        self.assertEqual((tail["stdout"]["offset"], self.text(tail["stdout"])), (2, "te\n"))
        self.assertEqual(ended["process"]["stdout_bytes"], 5)

    def test_a_kill_ends_the_jobs_a_shell_put_in_groups_of_their_own(self):
        pid = self.start(["/bin/bash", "-c", "set -m; sleep 30 & echo $!; wait"])["pid"]
        job = int(self.until_text(pid, "\n").strip())
        self.assertNotEqual(os.getpgid(job), pid, "the job has a group of its own")
        self.agent.call({"op": "proc_kill", "pid": pid})
        end = time.monotonic() + 5
        while time.monotonic() < end and os.path.exists(f"/proc/{job}"):
            time.sleep(0.02)
        self.assertFalse(os.path.exists(f"/proc/{job}"), "the job lives on")


if __name__ == "__main__":
    unittest.main()
