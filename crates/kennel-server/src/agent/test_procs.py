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


if __name__ == "__main__":
    unittest.main()
