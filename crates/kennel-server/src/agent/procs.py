"""A session's background processes, in the agent (see agent.py's ``start``, ``procs``,
``proc_read``, ``proc_stdin``, ``proc_signal`` and ``proc_kill`` requests). The agent carries
this source as a string and compiles it on the first request that needs it, with its own
helpers put into this module's namespace first (``read_available``, ``feed_pipe``,
``signal_group``, ``status_fields``, ``close_fds``).

A process started here outlives the request that started it: it runs in a session (and process
group) of its own until it ends, its timeout kills its group, or the sandbox ends. The agent
drains its stdout and stderr whenever it polls (idle, or during an exec), into a ring per
stream that keeps the last ``RING_MAX`` bytes with their offsets in the stream, so that a
process that writes more than anyone reads never blocks on a full pipe and never grows the
agent past its rings. Its entry stays, ended, until ``MAX_ENDED`` later ones have ended.
"""

import errno
import os
import time

RING_MAX = 1024 * 1024  # bytes of each stream kept, the last ones
STDIN_MAX = 1024 * 1024  # bytes written to a process's stdin and not yet taken by it
MAX_ENDED = 64  # ended processes still listed, the most recent
READ_CHUNK = 256 * 1024


class Ring:
    """The last ``RING_MAX`` bytes of one stream, and how many it has produced in all."""

    def __init__(self):
        self.data = bytearray()
        self.end = 0  # bytes produced so far: the offset just past the last one

    def add(self, chunk):
        self.data += chunk
        self.end += len(chunk)
        excess = len(self.data) - RING_MAX
        if excess > 0:
            del self.data[:excess]

    def read(self, offset, limit):
        """(bytes from offset, up to limit; the offset they start at; how many bytes before it
        were dropped): a reader behind the ring is moved to its start and told the loss."""
        start = self.end - len(self.data)
        dropped = max(0, start - offset)
        offset = min(max(offset, start), self.end)
        at = offset - start
        return bytes(self.data[at:at + limit]), offset, dropped


class Process:
    """One background process: its pipes, rings, stdin, deadline and end."""

    def __init__(self, proc, argv, out_fd, err_fd, in_fd, timeout):
        self.proc = proc
        self.pid = proc.pid
        self.argv = argv
        self.rings = {out_fd: Ring(), err_fd: Ring()}
        self.out, self.err = self.rings[out_fd], self.rings[err_fd]
        self.open = {out_fd, err_fd}
        self.in_fd = in_fd
        self.pending = bytearray()  # stdin written to us, not yet to the process
        self.close_after = False  # close stdin once pending is written
        self.started_ms = int(time.time() * 1000)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timed_out = False
        self.status = None
        self.usage = None
        self.ended_ms = None
        for fd in (out_fd, err_fd, in_fd):
            if fd is not None:
                os.set_blocking(fd, False)

    @property
    def running(self):
        return self.status is None

    def read(self, fd):
        data, eof = read_available(fd, READ_CHUNK)  # noqa: F821 (put here by the agent)
        self.rings[fd].add(data)
        if eof:
            self.open.discard(fd)
            os.close(fd)

    def feed(self):
        if self.in_fd is None:
            return
        if self.pending:
            taken = feed_pipe(self.in_fd, self.pending)  # noqa: F821
            if taken is None:
                return
            del self.pending[:taken]
        if not self.pending and self.close_after:
            self.close_stdin()

    def close_stdin(self):
        if self.in_fd is not None:
            os.close(self.in_fd)
            self.in_fd = None

    def reap(self):
        """Notes the process's end, if it has ended (it is reaped: its pid is no longer ours,
        though its group may live on in processes it left behind)."""
        if self.status is not None:
            return
        pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            return
        self.status = status
        # Popen must not wait for it again: its pid may be another's by then.
        self.proc.returncode = status
        self.ended_ms = int(time.time() * 1000)
        self.usage = {
            "cpu_ms": int((rusage.ru_utime + rusage.ru_stime) * 1000),
            "memory_peak_bytes": rusage.ru_maxrss * 1024,
        }
        self.close_stdin()

    def end_fields(self):
        code, sig = status_fields(self.status)  # noqa: F821
        return {"exit_code": code, "signal": sig, "timed_out": self.timed_out}

    def describe(self):
        return {
            "pid": self.pid,
            "argv": self.argv,
            "state": "running" if self.running else "exited",
            "started_at_unix_ms": self.started_ms,
            "ended_at_unix_ms": self.ended_ms,
            "stdin": self.in_fd is not None,
            "stdout_bytes": self.out.end,
            "stderr_bytes": self.err.end,
            "usage": self.usage,
            **self.end_fields(),
        }

    def close(self):
        close_fds(list(self.open))  # noqa: F821
        self.open.clear()
        self.close_stdin()


class Processes:
    """The background processes of a session, by pid."""

    def __init__(self, max_processes):
        self.max_processes = max_processes
        self.by_pid = {}

    def get(self, pid):
        process = self.by_pid.get(pid)
        if process is None:
            raise LookupError(pid)
        return process

    def running(self):
        return sum(1 for p in self.by_pid.values() if p.running)

    def start(self, argv, cwd, env, with_stdin, timeout, creds=None):
        """Starts argv; ``creds`` are Popen's ``user``, ``group`` and ``extra_groups`` for a
        process of another user (the agent's ``launch_as``)."""
        if self.running() >= self.max_processes:
            raise OverflowError(f"{self.max_processes} processes run already")
        import subprocess

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if with_stdin else (os.open(os.devnull, os.O_RDONLY), None)
        try:
            proc = subprocess.Popen(argv, stdin=in_r, stdout=out_w, stderr=err_w, env=env,
                                    cwd=cwd, close_fds=True, start_new_session=True,
                                    **(creds or {}))
        except BaseException:
            close_fds([out_r, err_r, in_w])  # noqa: F821
            raise
        finally:
            close_fds([out_w, err_w, in_r])  # noqa: F821
        process = Process(proc, argv, out_r, err_r, in_w, timeout)
        self.by_pid[process.pid] = process
        self.forget_old()
        return process

    def forget_old(self):
        ended = sorted((p for p in self.by_pid.values() if not p.running and not p.open),
                       key=lambda p: p.ended_ms)
        for p in ended[: max(0, len(ended) - MAX_ENDED)]:
            p.close()
            del self.by_pid[p.pid]

    def fds(self):
        """(fds to read, fds to write) for poll."""
        reads, writes = [], []
        for p in self.by_pid.values():
            reads.extend(p.open)
            if p.in_fd is not None and (p.pending or p.close_after):
                writes.append(p.in_fd)
        return reads, writes

    def owner(self, fd):
        for p in self.by_pid.values():
            if fd in p.open or fd == p.in_fd:
                return p
        return None

    def on_ready(self, fd):
        """Reads an output pipe poll found ready, or feeds a stdin pipe it found writable."""
        p = self.owner(fd)
        if p is None:
            return
        if fd in p.open:
            p.read(fd)
        elif fd == p.in_fd:
            p.feed()

    def check(self, now):
        """Reaps what ended; kills the groups whose timeout has come."""
        for p in self.by_pid.values():
            p.reap()
            if p.running and p.deadline is not None and now >= p.deadline and not p.timed_out:
                p.timed_out = True
                signal_group(p.pid, 9)  # noqa: F821
        self.forget_old()

    def timer(self):
        deadlines = [p.deadline for p in self.by_pid.values()
                     if p.running and p.deadline is not None and not p.timed_out]
        return min(deadlines, default=None)

    def write_stdin(self, p, data, eof):
        if p.in_fd is None or p.close_after:
            raise BrokenPipeError(errno.EPIPE, "the process has no stdin open")
        if len(p.pending) + len(data) > STDIN_MAX:
            raise BlockingIOError(errno.EAGAIN,
                                  f"more than {STDIN_MAX} bytes wait for the process to read them")
        p.pending += data
        p.close_after = eof
        p.feed()

    def kill_all(self):
        for p in self.by_pid.values():
            signal_group(p.pid, 9)  # noqa: F821
