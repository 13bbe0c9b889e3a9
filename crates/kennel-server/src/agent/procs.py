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

A process started with a terminal (``tty``) runs on a pty of the sandbox's own devpts as the
leader of its session, with the pty as its controlling terminal: its one output stream is what
the pty's master reads (stdout; stderr stays empty), and its stdin is the master. A terminal is
such a process running ``bash --login``, counted apart (at most ``max_terminals``).
"""

import errno
import fcntl
import os
import struct
import termios
import time

RING_MAX = 1024 * 1024  # bytes of each stream kept, the last ones
STDIN_MAX = 1024 * 1024  # bytes written to a process's stdin and not yet taken by it
MAX_ENDED = 64  # ended processes still listed, the most recent
READ_CHUNK = 256 * 1024
# Seconds a pty is still read after its process ended. Its master then closes, whether or not
# it reached its end of file: gVisor's never does while the process's session lives on, and a
# job the shell left behind would hold Linux's open too.
PTY_GRACE = 0.2


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


def set_size(fd, size):
    """Sets a pty's window size; the kernel sends SIGWINCH to its foreground group."""
    cols, rows = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def take_terminal():
    """In the child, after setsid: its stdin, the pty, becomes its controlling terminal, so
    that job control, ^C and SIGWINCH reach it as in a terminal emulator."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Process:
    """One background process: its pipes (or pty), rings, stdin, deadline and end."""

    def __init__(self, proc, argv, out_fd, err_fd, in_fd, timeout, tty=None, terminal=False):
        self.proc = proc
        self.pid = proc.pid
        self.argv = argv
        self.out, self.err = Ring(), Ring()
        self.rings = {out_fd: self.out}
        if err_fd is not None:
            self.rings[err_fd] = self.err
        self.open = set(self.rings)
        self.tty = tty  # (cols, rows) of its pty, or None
        self.pty = out_fd if tty is not None else None
        self.terminal = terminal
        self.in_fd = in_fd
        self.pending = bytearray()  # stdin written to us, not yet to the process
        self.close_after = False  # close stdin once pending is written
        self.started_ms = int(time.time() * 1000)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timed_out = False
        self.reaped_at = None  # monotonic time it was reaped
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
        self.reaped_at = time.monotonic()
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
            "terminal": self.terminal,
            "tty": None if self.tty is None else {"cols": self.tty[0], "rows": self.tty[1]},
            "stdout_bytes": self.out.end,
            "stderr_bytes": self.err.end,
            "usage": self.usage,
            **self.end_fields(),
        }

    def resize(self, size):
        if self.tty is None:
            raise OSError(errno.ENOTTY, "the process has no terminal: start it with `tty`")
        if self.pty in self.open:
            set_size(self.pty, size)
        self.tty = size

    def pty_closes_at(self):
        """When its pty's master is closed, once it has ended; None while it runs or has none."""
        if self.pty is None or self.pty not in self.open or self.reaped_at is None:
            return None
        return self.reaped_at + PTY_GRACE

    def close_pty(self):
        """Reads what its pty holds, then closes it: nothing more is read from it."""
        self.read(self.pty)
        if self.pty in self.open:
            self.open.discard(self.pty)
            os.close(self.pty)

    def has_news(self, offsets):
        """Whether a reader at these offsets has anything to be told: bytes past them, or the
        end."""
        out, err = offsets
        return self.out.end > out or self.err.end > err or (not self.running and not self.open)

    def close(self):
        close_fds(list(self.open))  # noqa: F821
        self.open.clear()
        self.close_stdin()


class Processes:
    """The background processes of a session, by pid."""

    def __init__(self, max_processes, max_terminals):
        self.max_processes = max_processes
        self.max_terminals = max_terminals
        self.by_pid = {}

    def get(self, pid):
        process = self.by_pid.get(pid)
        if process is None:
            raise LookupError(pid)
        return process

    def running(self, terminal):
        return sum(1 for p in self.by_pid.values() if p.running and p.terminal == terminal)

    def start(self, argv, cwd, env, with_stdin, timeout, tty=None, terminal=False):
        """Starts a process; ``tty`` is (cols, rows) for one on a pty."""
        bound = self.max_terminals if terminal else self.max_processes
        if self.running(terminal) >= bound:
            kind = "terminals" if terminal else "processes"
            raise OverflowError(f"{bound} {kind} run already")
        if tty is not None:
            process = self.start_on_pty(argv, cwd, env, timeout, tty, terminal)
        else:
            process = self.start_on_pipes(argv, cwd, env, with_stdin, timeout)
        self.by_pid[process.pid] = process
        self.forget_old()
        return process

    def start_on_pty(self, argv, cwd, env, timeout, tty, terminal):
        import subprocess

        master, slave = os.openpty()
        try:
            set_size(master, tty)
            proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                    cwd=cwd, close_fds=True, start_new_session=True,
                                    preexec_fn=take_terminal)
            writer = os.dup(master)  # stdin's fd, closed apart from the output's
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return Process(proc, argv, master, None, writer, timeout, tty, terminal)

    def start_on_pipes(self, argv, cwd, env, with_stdin, timeout):
        import subprocess

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if with_stdin else (os.open(os.devnull, os.O_RDONLY), None)
        try:
            proc = subprocess.Popen(argv, stdin=in_r, stdout=out_w, stderr=err_w, env=env,
                                    cwd=cwd, close_fds=True, start_new_session=True)
        except BaseException:
            close_fds([out_r, err_r, in_w])  # noqa: F821
            raise
        finally:
            close_fds([out_w, err_w, in_r])  # noqa: F821
        return Process(proc, argv, out_r, err_r, in_w, timeout)

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
            closes = p.pty_closes_at()
            if closes is not None and now >= closes:
                p.close_pty()
        self.forget_old()

    def timer(self):
        deadlines = [p.deadline for p in self.by_pid.values()
                     if p.running and p.deadline is not None and not p.timed_out]
        deadlines.extend(t for t in (p.pty_closes_at() for p in self.by_pid.values())
                         if t is not None)
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

    def kill(self, p):
        """Kills a process, its group and the rest of its session: a terminal's shell puts
        each job in a group of its own, all in the shell's session."""
        signal_group(p.pid, 9)  # noqa: F821
        for pid in session_members(p.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass

    def kill_all(self):
        for p in self.by_pid.values():
            signal_group(p.pid, 9)  # noqa: F821


def session_members(sid):
    """The pids of the processes in session ``sid``, as /proc shows them."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        # After "pid (comm) ": state ppid pgrp session; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(name))
    return members
