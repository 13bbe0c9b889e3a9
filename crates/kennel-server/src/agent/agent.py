"""Kennel session agent: the only program of a session sandbox.

Kennel starts it as ``/usr/bin/python3 -u -c <boot> [MODULES]``, where ``<boot>`` (a few
lines) reads this file, or its bytecode, from the first line of stdin: ``{"op":"boot",...}``
(which the agent, once running, ignores: a resumed microVM's gets it again). ``MODULES`` (a pooled
sandbox of an image) is the image's ``preload`` list, comma-separated: the agent imports them
before it answers anything, so every kernel it forks starts with them imported and the first
run pays nothing for them. A module that fails to import is reported on stderr and skipped
(the code's own import then fails as it would cold). It lives as long as the session (or
one pooled run) and talks to the server over its own stdin (requests) and stdout (responses),
in JSON lines: one compact JSON object per line, UTF-8, newline-terminated. Requests are
processed one at a time, in order; every response line echoes the request's integer ``id``.
Blank request lines are ignored. Executed code never sees the agent's fds 0 and 1: it gets
pipes of its own. The agent's stderr carries diagnostics only.

Paths
-----
Every file op takes an absolute ``path`` that must normalise (``os.path.normpath``) to
something under ``/workspace/`` or ``/tmp/`` (``list`` also accepts exactly ``/workspace`` or
``/tmp``); the normalised path is used. Otherwise the answer is
``{"id":N,"event":"error","errno":"EINVAL","message":"path must be under /workspace or /tmp"}``.

No symlink is ever followed, as in the native tier's collect of a one-shot run (openat2 with
``RESOLVE_NO_SYMLINKS``): the path is walked from ``/`` one component at a time with
``O_NOFOLLOW`` (``open_parent``), and a path that is, or passes through, a symlink (a link
to a directory such as ``/workspace/link -> /etc`` included) is refused with ``ELOOP`` and
the message "is or passes through a symlink; not followed". ``read``, ``write`` and ``list``
refuse a symlink as the last component too; ``delete`` removes such a symlink itself.

Requests
--------
``{"op":"exec","id":N,"kind":"shell","command":S,"shell":"bash"|"sh","timeout_ms":T,
"output_limit":B,"stdin_b64":D,"env":{...},"cwd":P}``
    Runs ``/bin/bash -c S`` (``shell`` defaults to ``bash``; ``sh`` is ``/bin/sh``) in a new
    session (its own process group). ``stdin_b64`` (optional) is fed to its stdin, which is then
    closed; without it stdin is ``/dev/null``. Shell execs (not ``one_shot`` ones: a pooled run
    is ``bash -c S`` exactly) share a state, as commands typed into one terminal do: the
    directory and the exported environment a shell ends with (by ``exit`` too; not when it is
    killed or ``exec``s another program, or sets its own EXIT trap) are the next shell exec's,
    starting from ``/workspace`` if it exists (else the agent's own cwd) and the agent's
    environment. An EXIT trap put before S on its line writes them into a pipe of the agent's,
    opened through /proc (the code inherits no fd of the agent's). ``env`` (optional, strings to
    strings) is added to the environment for this exec; ``cwd`` (optional) replaces the
    directory for this exec. At ``timeout_ms`` the whole process group is killed (SIGKILL) and
    ``timed_out`` is true. When the main process exits, whatever is left of its process group is
    killed (background jobs do not linger); output is read until both pipes reach EOF, but at
    most 200 ms past the main process's exit (descendants that left the group may hold the pipes
    open). ``user`` (optional, ``"default"`` or ``"user"``; see "Users" below the requests) says
    who runs it; each user's shell execs keep a state of their own.

``{"op":"exec","id":N,"kind":"python","code":C,"timeout_ms":T,"output_limit":B,"stdin_b64":D}``
    Runs ``exec(compile(C, "<session>", "exec"), namespace)`` in the persistent interpreter
    (the "kernel"): variables, imports and functions survive between python execs, like a
    Jupyter kernel (``__name__ == "__main__"``; ``sys.modules["__main__"]`` is that
    namespace). Its cwd is the default exec cwd; ``env``/``cwd`` are not supported. Output of
    ``print``, of ``sys.stdout``/``sys.stderr`` (line-buffered, flushed at the end of every
    exec), of ``os.write(1, ...)`` and of subprocesses is captured at the fd level; stdin is
    ``stdin_b64`` as for shell. Exit status is that of ``python3 -c``: normal end 0; an
    uncaught exception prints its traceback to stderr, 1; ``SystemExit(n)`` gives n (``None``
    0; an int beyond i32 n & 255; anything else is printed to stderr, 1) and the interpreter
    keeps running with its state. At ``timeout_ms`` the kernel gets SIGINT: a
    KeyboardInterrupt traceback goes to stderr, ``timed_out`` is true, ``exit_code`` null,
    state kept. A kernel still busy 2 s later is killed with its process group and a fresh one
    is started: ``interpreter.restarted`` true, state lost. A kernel that dies during an exec
    (``os._exit``, a segfault, the OOM killer) is reported with its own
    ``exit_code``/``signal`` and ``interpreter.crashed`` and ``restarted`` true; one found
    dead before an exec is replaced and reported the same way, with the exec's own status.
    Fresh kernels are started eagerly, at agent start and after every restart. After the code
    ends (its result known), output is read as for shell: until EOF, at most 200 ms more (a
    background process the code started may hold the pipes). With ``"one_shot": true`` (a
    pooled one-shot run, whose sandbox ends right after) the code sees what ``python3 -c``
    shows it: ``sys.argv == ["-c"]``, tracebacks name ``"<string>"``, and the timeout kills
    the kernel at once (``signal`` 9) instead of interrupting it. With ``"user": "user"`` the
    code runs in a second kernel, started on the first such exec as uid 1000, with the same
    rules and a state of its own. ``"reseed": true`` (any exec's, the first after the server
    resumed a paused session) has every kernel seed its ``random`` and numpy generators afresh
    from the kernel's pool before its next exec, as a new interpreter's are.

    A session exec (not one-shot) has rich results, made by rich.py (its docstring has the
    rules), which the kernel compiles on its first session exec: the value of the last
    expression statement, ``display(obj)`` (a builtin, as in IPython) and matplotlib's
    figures (``plt.show()``, and those still open at the end), each sent as it comes as
    ``{"id":N,"event":"display","output":{"kind":"value"|"display","data":{MIME:...}}}``.
    ``figure_formats`` (optional, a list of ``"png"`` and ``"svg"``, default ``["png"]``)
    says how figures are rendered. A one-shot exec has none of this, as ``python3 -c``,
    unless it asks (``"rich": true``: a run that asked for rich results).

``{"op":"write","id":N,"path":P,"b64":D,"mode":M}``
    Creates the parent directories, then replaces P atomically (temporary file + rename) with
    the decoded bytes and permission bits M (optional, default 420 = 0o644); a symlink at P
    is refused (ELOOP), as above. Answer ``{"id":N,"event":"ok","size":bytes}``.

``{"op":"read","id":N,"path":P,"max_bytes":B}``
    Answer ``{"id":N,"event":"file","size":total_size,"truncated":bool,"b64":first_B_bytes}``.
    A symlink anywhere in P is refused (ELOOP), a directory (EISDIR) and any other
    non-regular file (EINVAL) too; FIFOs never block.

``{"op":"delete","id":N,"path":P}``
    Deletes a file, a symlink (not what it points to), or a directory recursively (symlinks in
    it are removed, not followed). Answer ``{"id":N,"event":"ok"}``.

``{"op":"list","id":N,"path":P}``
    Answer ``{"id":N,"event":"entries","entries":[{"name":"a.txt","type":"file"|"dir"|
    "symlink"|"other","size":N,"mode":420}, ...]}`` sorted by name (entries that are
    symlinks are listed as such, not followed; P itself must not be or pass through one;
    ``mode`` is the permission bits; names that are not UTF-8 get U+FFFD).

``{"op":"pack","id":N,"path":P,"max_bytes":B}``
    The directory P (``/workspace``, ``/tmp`` or one under them, not through a symlink) as
    an uncompressed tar archive, names relative to P, symlinks stored as symlinks: answered
    as ``read`` answers (``truncated`` false); EFBIG when it would pass B bytes.

``{"op":"unpack","id":N,"path":P,"b64":D,"max_bytes":B}``
    Extracts the tar archive D (plain, gzip, bzip2 or xz) under the directory P, made if
    missing. The whole archive is checked first, and nothing is written when a member has an
    absolute name or a ``..`` component (EINVAL), is a hard link, a device or a FIFO
    (EINVAL), or the contents pass B bytes (EFBIG). Files keep their permission bits (setuid,
    setgid and sticky dropped), replacing what is there; no path is followed through a
    symlink, as for ``write``. Answer ``{"id":N,"event":"ok","size":bytes_written}``.

``{"op":"define","id":N,"sources":{"rich":S,"archive":S,"procs":S}}``
    The sources of rich.py, archive.py and procs.py, which a session's agent is sent once,
    before its first python exec, archive or process request (a pooled one-shot sandbox never
    is: it stays as small as it was). Answered at once, during an exec too. Answer
    ``{"id":N,"event":"ok"}``.

Background processes (procs.py) outlive the request that starts them, and every request on
them is answered at once, while an exec runs too. A process is named by its ``pid``: only
those started here; any other (the agent, the kernel, an exec's) is ESRCH.

``{"op":"start","id":N,"argv":[S,...],"cwd":P,"env":{...},"stdin":B,"timeout_ms":T,
"max_processes":M}``
    Starts argv in a session (and process group) of its own, with the agent's environment
    plus ``env``, in ``cwd`` (optional; the default exec cwd), with a stdin to write to when
    ``stdin`` is true (else /dev/null); ``timeout_ms`` (optional) kills its group. EAGAIN
    when M processes run already. ``user`` as for exec. Answer
    ``{"id":N,"event":"started",...}`` with the process as ``procs`` lists it.

``{"op":"procs","id":N}``
    Answer ``{"id":N,"event":"procs","procs":[{"pid":P,"argv":[...],"state":"running"|
    "exited","exit_code":C,"signal":S,"timed_out":B,"started_at_unix_ms":T,
    "ended_at_unix_ms":T|null,"stdin":B,"stdout_bytes":N,"stderr_bytes":N,
    "usage":{"cpu_ms":N,"memory_peak_bytes":N}|null}, ...]}`` (running ones, and the last 64
    that ended).

``{"op":"proc_read","id":N,"pid":P,"stdout_offset":O,"stderr_offset":O,"max_bytes":B}``
    Each stream keeps its last MiB. Answer ``{"id":N,"event":"proc_output","stdout":
    {"offset":O,"b64":D,"dropped":K},"stderr":{...},"ended":B,"process":{...}}``: up to B
    bytes of each from its offset (moved up to the oldest byte kept, ``dropped`` saying how
    many were lost); ``ended`` once the process has ended and its pipes are drained.

``{"op":"proc_stdin","id":N,"pid":P,"b64":D,"eof":B}``
    Queues D for its stdin (EAGAIN past a MiB not yet read; EPIPE when it has none open),
    closing it after when ``eof``. Answer ``{"id":N,"event":"ok"}``.

``{"op":"watch","id":N,"path":P,"recursive":B,"max_watches":M}``
    Watches the directory P (``/workspace``, ``/tmp`` or one under them, not through a
    symlink) with inotify, and every directory under it when ``recursive`` (watch.py has the
    rules); EAGAIN when M are open. Answered at once, as ``watch_read`` and ``unwatch``.
    Answer ``{"id":N,"event":"watching","wid":W}``.

``{"op":"watch_read","id":N,"wid":W,"from":S,"max_events":K}``
    Answer ``{"id":N,"event":"watch_events","events":[{"seq":S,"type":"create"|"modify"|
    "delete"|"rename"|"overflow","path":P,"to":P,"dir":B,"lost":K}, ...],"next":S,
    "dropped":K}``: up to K events numbered from S, the number to read from next, and how
    many before S the ring no longer keeps.

``{"op":"unwatch","id":N,"wid":W}``
    Ends the watch. Answer ``{"id":N,"event":"ok"}``.

``{"op":"proc_signal","id":N,"pid":P,"signal":S}`` and ``{"op":"proc_kill","id":N,"pid":P}``
    Signal the process (nothing once it has ended), or SIGKILL it and what is left of its
    group. Answer ``{"id":N,"event":"ok"}``.

``{"op":"ping","id":N}``
    Answer ``{"id":N,"event":"pong","pid":agent_pid,"kernel_pid":pid_or_null}``.

``{"op":"interrupt","id":N,"target":T}`` and ``{"op":"cancel","id":N,"target":T}``
    Act on the exec that is running, at once (every other request that comes during an exec
    waits until it ends), if ``target`` (optional) is its id or absent: ``interrupt`` sends
    SIGINT, as Ctrl-C would, to the python code (a ``KeyboardInterrupt``; one sent before the
    code started is sent as it starts) or to a shell's process group; ``cancel`` ends the exec
    as its timeout would, and its result has ``"cancelled": true`` and ``"timed_out": false``
    (a cancel that comes once the exec's time is up leaves it timed out). Answer
    ``{"id":N,"event":"ok"}``, also when no exec runs.

Users
-----
``"user": "user"`` runs what an exec or ``start`` starts as uid and gid 1000, with no
supplementary groups, ``HOME=/workspace``, ``USER=LOGNAME=user``; the first such request gives
/workspace (the directory itself) to 1000:1000. Where the sandbox cannot (its user namespace
maps no uid or gid 1000, it keeps no CAP_SETUID and CAP_SETGID, or setgroups is denied) it is
answered ``{"id":N,"event":"error","errno":"EPERM","message":"`user` is refused here: ..."}``
and nothing starts. Before every session python exec each kernel puts the user site
(``$HOME/.local/lib/pythonX.Y/site-packages``) on ``sys.path`` and, once it exists,
``site.addsitedir``s it (its .pth files), so that what ``pip install --user`` put there by a
shell exec of either user imports.

Exec responses
--------------
While the code runs, output as it is produced, what is available at once coalesced:
``{"id":N,"event":"stdout","b64":D}`` and ``{"id":N,"event":"stderr","b64":D}``. Only the
first ``output_limit`` bytes of each stream are sent (a chunk crossing the limit is cut); the
rest is counted and discarded, and the pipes keep being drained. Then exactly one
``{"id":N,"event":"result","exit_code":int|null,"signal":int|null,"timed_out":bool,
"duration_ms":int,"stdout_bytes":int,"stderr_bytes":int,"stdout_truncated":bool,
"stderr_truncated":bool,"interpreter":{"restarted":bool,"crashed":bool,"reason":str|null}}``
where ``*_bytes`` count everything produced, ``signal`` is set when the process (the kernel,
for python) was killed by a signal, and ``interpreter`` is null for shell execs. A python
exec's result also has ``"usage":{"cpu_ns":int,"max_rss_bytes":int}|null``: the kernel's CPU
time over the exec and its peak resident size, by its own account (null when it died first).
A session python exec's result also has ``"error":{"name":str,"value":str,"traceback":[str]}|
null`` (the exception the code ended with, SystemExit aside; null when the kernel died) and
``"results_truncated":bool`` (rich outputs were dropped for the output limit or their number).
``exit_code`` is null whenever ``timed_out`` or ``cancelled`` is true or ``signal`` is set.

Errors
------
An exec whose process cannot be started (a missing ``cwd``, say) and every failed file op are
answered ``{"id":N,"event":"error","errno":"ENOENT","message":"<strerror>"}`` (the errno's
name). A malformed line (bad JSON, not an object, unknown op, missing field, wrong type, bad
base64) is answered ``{"id":N|null,"event":"error","errno":"EINVAL","message":...}``, with id
null when the id itself is unusable; the agent carries on. When its stdin reaches EOF the
agent kills the kernel and exits 0.
"""

# Lean imports: a pooled sandbox pays for every module the agent imports before its one run.
# json, base64, socket and signal are thin Python layers over C modules, and the layers import
# re and enum: on a python whose site imports neither (an image's, or most hosts'), they were
# 8-13 ms of the agent's start. The agent uses the C modules; see "Lean codecs" below.
import _json
import _signal as signal  # signal.py adds enum wrappers only; the names are the same
import _socket
import array
import binascii
import builtins
import errno
import io
import itertools
import os
import resource
import select
import stat
import sys
import time

ROOTS = ("/workspace", "/tmp")
SHELLS = {"bash": "/bin/bash", "sh": "/bin/sh"}
EXIT_GRACE = 0.2  # seconds output is still read after the main process ended
INTERRUPT_GRACE = 2.0  # seconds a timed-out python exec gets to stop after SIGINT
READ_SIZE = 64 * 1024
CHUNK_MAX = 256 * 1024  # most bytes of one stream coalesced into one output event
REQUEST_READ_SIZE = 1024 * 1024
CONTROL_OPS = ("interrupt", "cancel")  # requests that act on the running exec
# Requests on background processes and file watches: answered at once, during an exec too
# (none of them holds the agent up: a read that waits for news is parked, see Agent.park).
BACKGROUND_OPS = ("start", "procs", "proc_read", "proc_stdin", "proc_signal", "proc_kill",
                  "proc_resize", "watch", "watch_read", "unwatch")
IMMEDIATE_OPS = ("define", *BACKGROUND_OPS)
SHELL_STATE_MAX = 1024 * 1024  # most bytes of a shell's saved cwd and environment
SHELL_NOT_KEPT = ("SHLVL", "_")  # set by each shell itself
MAX_POLL_MS = 3_600_000
HEADER_SIZE = 16  # kernel request header: the request's length in ASCII digits
KERNEL_LINE_MAX = 16 * 1024 * 1024  # longest line the agent takes from a kernel
FIGURE_FORMATS = ("png", "svg")
# The sources of rich.py and archive.py, by name, as the server's define request gave them
# (sessions only: a pooled one-shot sandbox is never sent them): each is compiled on the first
# request that needs it.
LAZY_SOURCES = {}
_REQUIRED = object()
_TEMP_NAMES = itertools.count()


# --- Lean codecs ----------------------------------------------------------------------------


class _Decoding:
    """What json's C scanner reads from its decoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_SCAN = _json.make_scanner(_Decoding())


def json_loads(data):
    """json.loads(data): the C scanner json itself uses, on UTF-8 text; whatever it refuses is
    handed to json, so that every error (and any other encoding) is json's own."""
    try:
        text = (data.decode("utf-8") if isinstance(data, bytes) else data).strip(" \t\n\r")
        value, end = _SCAN(text, 0)
        if end == len(text):
            return value
    except Exception:  # noqa: BLE001 - json below says what was wrong
        pass
    import json

    return json.loads(data)


def _not_serializable(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_dumps(value):
    """json.dumps(value, separators=(",", ":")): ASCII, compact, with json's C encoder."""
    encode = _json.make_encoder(
        {}, _not_serializable, _json.encode_basestring_ascii, None, ":", ",", False, False, True
    )
    return "".join(encode(value, 0))


def b64decode(text):
    """base64.b64decode(text, validate=True); ValueError when text is not base64."""
    data = text.encode("ascii")
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except TypeError:  # a python before 3.11: no strict mode in binascii
        import base64

        return base64.b64decode(data, validate=True)


def socketpair():
    return _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)


def send_fds(sock, buffers, fds):
    """socket.send_fds."""
    rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))]
    return sock.sendmsg(buffers, rights)


def recv_fds(sock, bufsize, maxfds):
    """socket.recv_fds: (data, fds, flags, address)."""
    fds = array.array("i")
    msg, ancdata, flags, addr = sock.recvmsg(bufsize, _socket.CMSG_LEN(maxfds * fds.itemsize))
    for level, kind, data in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds), flags, addr


class ProtocolClosed(Exception):
    """The server closed the agent's stdout: nobody is listening any more."""


class BadRequest(Exception):
    """A request the agent cannot accept; answered with EINVAL."""


class KernelLost(Exception):
    """The kernel's control channel broke or carried nonsense."""


# --- Protocol I/O -------------------------------------------------------------------------


def wait_fd(fd, events):
    """Blocks until fd is ready for events (for fds someone made non-blocking)."""
    poller = select.poll()
    poller.register(fd, events)
    poller.poll()


def write_all(fd, data):
    """Writes all of data to fd, across partial writes and EAGAIN (EINTR is retried by os)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            wait_fd(fd, select.POLLOUT)


def send(event):
    """Writes one response line to the agent's stdout with a single write."""
    line = json_dumps(event).encode("ascii") + b"\n"
    try:
        write_all(1, line)
    except OSError as exc:
        raise ProtocolClosed() from exc


def send_error(rid, name, message):
    message = message.encode("utf-8", "replace").decode("utf-8")
    send({"id": rid, "event": "error", "errno": name, "message": message})


def send_proc_output(rid, process, offsets, limit):
    """Answers a read of a process's output from ``offsets``."""
    streams = {}
    for name, ring, at in (("stdout", process.out, offsets[0]), ("stderr", process.err, offsets[1])):
        data, offset, dropped = ring.read(at, limit)
        streams[name] = {"offset": offset, "b64": b64(data), "dropped": dropped}
    # Ended once its end is known and its pipes are drained: nothing more will come.
    ended = not process.running and not process.open
    send({"id": rid, "event": "proc_output", **streams, "ended": ended,
          "process": process.describe()})


def send_failure(rid, exc):
    """Answers a request that failed with its error: a bad request or an OS error as such,
    anything else as an internal error, whose traceback goes to the agent's stderr."""
    if isinstance(exc, BadRequest):
        send_error(rid, "EINVAL", str(exc))
    elif isinstance(exc, OSError):
        send_os_error(rid, exc)
    elif isinstance(exc, (ValueError, TypeError, OverflowError)):  # e.g. a NUL in a path
        send_error(rid, "EINVAL", str(exc))
    else:
        import traceback

        traceback.print_exception(exc)
        send_error(rid, "EIO", f"internal error: {type(exc).__name__}: {exc}")


def send_os_error(rid, exc):
    send_error(rid, errno.errorcode.get(exc.errno, "EIO"), exc.strerror or str(exc))


def b64(data):
    return binascii.b2a_base64(data, newline=False).decode("ascii")


class LineReader:
    """Splits a blocking or non-blocking fd into lines."""

    def __init__(self, fd):
        self.fd = fd
        self.buffer = bytearray()
        self.scanned = 0  # bytes of buffer known to hold no newline
        self.eof = False
        self.queued = []  # lines read during an exec, to be served after it

    def next_line(self):
        """The next line without its newline, if one is buffered (a last unterminated line
        counts at EOF); None otherwise, without reading."""
        if self.queued:
            return self.queued.pop(0)
        end = self.buffer.find(b"\n", self.scanned)
        if end >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            self.scanned = 0
            return line
        self.scanned = len(self.buffer)
        if self.eof and self.buffer:
            line, self.buffer = bytes(self.buffer), bytearray()
            return line
        return None

    def fill(self):
        try:
            chunk = os.read(self.fd, REQUEST_READ_SIZE)
        except BlockingIOError:
            wait_fd(self.fd, select.POLLIN)
            return
        self.buffer += chunk
        self.eof = not chunk

    def take_ready(self, read=True):
        """The complete lines after one read of an fd that poll found readable, or (read
        false) those already buffered: read with the exec's own request, poll never tells."""
        if read:
            self.fill()
        *lines, rest = bytes(self.buffer).split(b"\n")
        self.buffer, self.scanned = bytearray(rest), 0
        return lines


# --- Request fields -----------------------------------------------------------------------


def field(request, name, kind, default=_REQUIRED):
    """request[name], checked to be a kind; null or absent gives default (if any)."""
    value = request.get(name)
    if value is None:
        if default is _REQUIRED:
            raise BadRequest(f"missing field {name!r}")
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {name!r} must be of type {kind.__name__}")
    return value


def count_field(request, name, default=_REQUIRED):
    value = field(request, name, int, default)
    if value is not None and value < 0:
        raise BadRequest(f"field {name!r} must not be negative")
    return value


def b64_field(request, name, default=_REQUIRED):
    text = field(request, name, str, default)
    if text is None:
        return None
    try:
        return b64decode(text)
    except ValueError:
        raise BadRequest(f"field {name!r} is not valid base64") from None


def env_field(request):
    env = field(request, "env", dict, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise BadRequest("field 'env' must map strings to strings")
    return env


def path_field(request, allow_root=False):
    """The request's path, normalised, if it lies under one of ROOTS."""
    path = field(request, "path", str)
    norm = os.path.normpath(path)
    for root in ROOTS:
        if path.startswith("/") and (norm.startswith(root + "/") or (allow_root and norm == root)):
            return norm
    raise BadRequest("path must be under /workspace or /tmp")


# --- Users --------------------------------------------------------------------------------
#
# A request's ``user`` says who runs what it starts: "default" (the agent's own ids: root of
# the sandbox's user namespace, or nobody where the tier runs code so) or "user": uid and gid
# USER_ID, no supplementary groups, HOME=/workspace, USER=LOGNAME=user. The server refuses
# "user" where the sandbox's isolation says it cannot be had (kennel-types' user.rs, which is
# exact there); the agent checks what it can see itself (its uid and gid maps hold USER_ID,
# its effective capabilities hold CAP_SETUID and CAP_SETGID, it may call setgroups) and
# refuses with EPERM, as a second line.

USERS = ("default", "user")
USER_ID = 1000
USER_ENV = {"HOME": "/workspace", "USER": "user", "LOGNAME": "user"}
CAP_SETGID, CAP_SETUID = 6, 7


def user_field(request):
    """The request's ``user``, "default" when absent."""
    user = field(request, "user", str, "default")
    if user not in USERS:
        raise BadRequest("field 'user' must be 'default' or 'user'")
    return user


def maps_id(path, wanted):
    """Whether the id map at path (/proc/self/uid_map's format) maps ``wanted`` inside."""
    try:
        with open(path) as f:
            rows = [line.split() for line in f]
    except OSError:
        return False
    return any(len(r) == 3 and int(r[0]) <= wanted < int(r[0]) + int(r[2]) for r in rows)


def effective_caps():
    """The agent's effective capability mask, as /proc/self/status shows it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def user_refusal():
    """Why this sandbox cannot run code as USER_ID, seen from inside; None where it can."""
    if not all(maps_id(f"/proc/self/{m}", USER_ID) for m in ("uid_map", "gid_map")):
        return "the sandbox's user namespace has no uid and gid 1000"
    caps = effective_caps()
    if not (caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1):
        return "the sandbox keeps no CAP_SETUID and CAP_SETGID to switch with"
    try:
        with open("/proc/self/setgroups") as f:
            if f.read().strip() == "deny":
                return "the sandbox may not drop its supplementary groups (setgroups denied)"
    except FileNotFoundError:
        pass
    return None


USER_READY = None  # None until the first "user" request; then "" (ready) or why it is refused


def user_ready():
    """Checks, once, that USER_ID can be had, and gives it /workspace (its HOME) at once: the
    directory itself, not what root put in it; and /tmp the mode of every Linux /tmp, 1777,
    which a Docker Engine's tmpfs may lack (it copies up the image's /tmp, 0755 in an image
    made from a directory tree). PermissionError (EPERM) naming ``user`` where it cannot."""
    global USER_READY
    if USER_READY is None:
        why = user_refusal()
        try:
            if why is None and os.path.isdir("/workspace"):
                os.chown("/workspace", USER_ID, USER_ID)
            if why is None and os.path.isdir("/tmp") and os.stat("/tmp").st_mode & 0o7777 != 0o1777:
                os.chmod("/tmp", 0o1777)
        except OSError as exc:
            why = f"{exc.filename} cannot be made uid 1000's ({exc.strerror})"
        USER_READY = why or ""
    if USER_READY:
        raise PermissionError(errno.EPERM, f"`user` is refused here: {USER_READY}")


def launch_as(user, base, extra):
    """(env, Popen keyword arguments) that start a child as ``user`` ("default" or "user"),
    with the environment ``base`` plus the request's ``extra`` (dicts, not changed): for
    "user", USER_ID's ids, no supplementary groups, and its HOME, USER and LOGNAME over base's
    (the request's own still win). What a shell exec, a background process or a terminal
    calls before its Popen; EPERM where "user" cannot be had."""
    if user == "default":
        return {**base, **extra}, {}
    user_ready()
    creds = {"user": USER_ID, "group": USER_ID, "extra_groups": []}
    return {**base, **USER_ENV, **extra}, creds


def become_user():
    """Turns the calling process (a freshly forked kernel) into USER_ID, as ``launch_as``
    would start it, with its ``site`` recomputing the user site from the new HOME."""
    import site

    os.setgroups([])
    os.setgid(USER_ID)
    os.setuid(USER_ID)
    os.environ.update(USER_ENV)
    site.USER_BASE = site.USER_SITE = None  # computed from HOME on the next ask


# --- Processes ----------------------------------------------------------------------------


def watch_children():
    """Makes every child's exit wake poll(): SIGCHLD writes a byte to the returned fd."""
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    return read_end


def drain(fd):
    while True:
        try:
            if not os.read(fd, 4096):
                return
        except BlockingIOError:
            return


def has_exited(pid):
    """Whether our child pid has exited; it stays unreaped, so its pid (and pgid) stay ours."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def kill_group(pgid):
    signal_group(pgid, signal.SIGKILL)


def signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def status_fields(status):
    """(exit_code, signal) of a wait status; (None, None) if unknown."""
    if status is not None and os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if status is not None and os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def describe(status):
    code, sig = status_fields(status)
    if sig is not None:
        try:
            import signal as names  # only to name one: signal.py imports enum

            name = names.Signals(sig).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {sig} ({name})"
    return "ended" if code is None else f"exited with code {code}"


def clamp_exit_code(code):
    """Exit codes fit an i32 for the server; others become what the OS would make of them."""
    return code if -(2**31) <= code < 2**31 else code & 0xFF


def poll_timeout(now, deadline):
    """poll() milliseconds until deadline (None: no timer)."""
    if deadline is None:
        return None
    return min(int(max(0.0, deadline - now) * 1000) + 1, MAX_POLL_MS)


def close_fds(fds):
    for fd in fds:
        if fd is not None:
            os.close(fd)


def keeping_state(command, fd, inherited=False):
    """The command, after a trap that writes the shell's cwd and environment as it exits
    (NUL-separated: the cwd, then NAME=VALUE pairs) into the agent's fd, which the shell
    opens through /proc: the code's processes inherit no fd of the agent's. A shell of another
    uid than the agent's cannot open the agent's fds there: it inherits this one fd instead
    (``inherited``; only its own state goes through it). On the command's line, so that its
    own line numbers do not move. A command that sets its own EXIT trap replaces this one (and
    keeps no state)."""
    target = f"&{fd}" if inherited else f"/proc/{os.getpid()}/fd/{fd}"
    save = f'{{ printf "%s\\0" "$PWD"; /usr/bin/env -0; }} >{target} 2>/dev/null'
    return f"trap '{save}' EXIT; {command}"


def state_pipe():
    """The pipe a shell's EXIT trap writes its state to, as large as an environment that
    can still exec a program (/usr/bin/env) may be, so that the trap does not block."""
    import fcntl

    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, SHELL_STATE_MAX)
    except OSError:
        pass
    return r, w


def make_pipes(with_stdin):
    """Pipes for one exec: ([stdin, stdout, stderr] for the code, (stdout and stderr read
    ends, stdin write end or None) for the agent). Without stdin the code gets /dev/null."""
    fds = []
    try:
        for _ in range(3 if with_stdin else 2):
            fds.extend(os.pipe())
        if not with_stdin:
            fds.extend([os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None])
    except BaseException:
        close_fds(fds)
        raise
    out_r, out_w, err_r, err_w, in_r, in_w = fds
    return [in_r, out_w, err_w], (out_r, err_r, in_w)


# --- Exec I/O -----------------------------------------------------------------------------


class Output:
    """One output stream of an exec: how much was produced, how much of it is sent."""

    def __init__(self, event, limit):
        self.event = event
        self.limit = limit
        self.total = 0
        self.eof = False

    def keep(self, data):
        """The part of data that is within the limit; all of it is counted."""
        room = max(0, self.limit - self.total)
        self.total += len(data)
        return data[:room]

    @property
    def truncated(self):
        return self.total > self.limit


def read_available(fd, limit):
    """What a non-blocking fd holds now, up to about limit bytes: (data, reached_eof)."""
    chunks, size = [], 0
    while size < limit:
        try:
            chunk = os.read(fd, READ_SIZE)
        except BlockingIOError:
            break
        except OSError as exc:
            # A pty's master reads EIO once no process holds its other side, after all it
            # was sent: its end of file, with the chunks read before it kept.
            if exc.errno != errno.EIO:
                raise
            chunk = b""
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def feed_pipe(fd, pending):
    """Writes what a non-blocking pipe takes of pending: how many bytes are done with (all of
    them once the reader has closed its end: the rest is dropped), None when it is full."""
    try:
        return os.write(fd, pending[:READ_SIZE])
    except BlockingIOError:
        return None
    except OSError:  # EPIPE: the reader closed its end
        return len(pending)


class Pump:
    """Feeds an exec's stdin and streams its stdout and stderr as output events."""

    def __init__(self, rid, limit, out_fd, err_fd, in_fd, stdin):
        self.rid = rid
        self.outputs = {out_fd: Output("stdout", limit), err_fd: Output("stderr", limit)}
        self.in_fd = in_fd
        self.pending = memoryview(stdin or b"")
        for fd in self.outputs:
            os.set_blocking(fd, False)
        if in_fd is not None:
            os.set_blocking(in_fd, False)
            if not self.pending:
                self.close_stdin()

    @property
    def eof(self):
        return all(out.eof for out in self.outputs.values())

    def poll(self, timeout_ms, extra, extra_out=()):
        """Waits up to timeout_ms, moves what can be moved; returns which extra fds are ready:
        readable (``extra``) or writable (``extra_out``)."""
        poller = select.poll()
        for fd, out in self.outputs.items():
            if not out.eof:
                poller.register(fd, select.POLLIN)
        if self.in_fd is not None:
            poller.register(self.in_fd, select.POLLOUT)
        for fd in extra:
            poller.register(fd, select.POLLIN)
        for fd in extra_out:
            poller.register(fd, select.POLLOUT)
        ready = set()
        for fd, _ in poller.poll(timeout_ms):
            if fd in self.outputs:
                self.read(fd)
            elif fd == self.in_fd:
                self.feed()
            else:
                ready.add(fd)
        return ready

    def read(self, fd):
        out = self.outputs[fd]
        data, out.eof = read_available(fd, CHUNK_MAX)
        kept = out.keep(data)
        if kept:
            send({"id": self.rid, "event": out.event, "b64": b64(kept)})

    def read_ready(self):
        """Forwards what the pipes hold now."""
        for fd, out in self.outputs.items():
            if not out.eof:
                self.read(fd)

    def feed(self):
        taken = feed_pipe(self.in_fd, self.pending)
        if taken is None:
            return
        self.pending = self.pending[taken:]
        if not self.pending:
            self.close_stdin()

    def close_stdin(self):
        os.close(self.in_fd)
        self.in_fd = None

    def close(self):
        """Takes what is still buffered, then closes every pipe."""
        self.read_ready()
        for fd in self.outputs:
            os.close(fd)
        if self.in_fd is not None:
            self.close_stdin()

    def totals(self):
        out, err = self.outputs.values()
        return {
            "stdout_bytes": out.total,
            "stderr_bytes": err.total,
            "stdout_truncated": out.truncated,
            "stderr_truncated": err.truncated,
        }


class ShellRun:
    """A shell exec's main process: its timeout, its end, and its process group."""

    def __init__(self, proc, timeout):
        self.proc = proc
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.timed_out = False
        self.cancelled = False
        self.ended = None  # when the main process exited

    def check(self, now):
        if self.ended is not None:
            return
        if has_exited(self.proc.pid):
            kill_group(self.proc.pid)  # leftovers of the group: background jobs and such
            self.proc.wait()
            self.ended = now
        elif not self.timed_out and now >= self.deadline:
            kill_group(self.proc.pid)
            self.timed_out = True

    def timer(self):
        if self.ended is not None:
            return self.ended + EXIT_GRACE
        return None if self.timed_out else self.deadline

    def fds(self):
        return ()

    def on_ready(self, ready):
        pass

    def interrupt(self):
        if self.ended is None:
            signal_group(self.proc.pid, signal.SIGINT)

    def cancel(self):
        now = time.monotonic()
        self.cancelled = not self.timed_out and now < self.deadline
        self.deadline = min(self.deadline, now)

    def abort(self):
        if self.ended is None:
            kill_group(self.proc.pid)
            self.proc.wait()
            self.ended = time.monotonic()

    def outcome(self):
        code = self.proc.returncode
        return {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "timed_out": self.timed_out and not self.cancelled,
            "duration_ms": int((self.ended - self.start) * 1000),
            "cancelled": self.cancelled,
        }


class PythonRun:
    """A python exec in the kernel: its timeout (SIGINT, then SIGKILL) and its end."""

    def __init__(self, kernel, timeout, submitted, kill_on_timeout=False, on_display=None):
        self.kernel = kernel
        self.kill_on_timeout = kill_on_timeout  # one-shot: a timeout kills, as for a cold run
        self.on_display = on_display  # where a rich output goes (None: a one-shot run's)
        self.rich = {}  # what a session exec adds to its result: "error", "results_truncated"
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.timed_out = False
        self.started = False  # the kernel said the code runs (SIGINT is caught from then on)
        self.interrupted = False
        self.interrupt_asked = False  # by an interrupt request, before the code started
        self.cancelled = False
        self.killed = False  # killed by us for not stopping after SIGINT
        self.status = None  # the exit status the kernel reported
        kernel.usage = None  # and what the exec used, reported with it
        self.dead = None  # wait status of a kernel that died (or was killed) during the exec
        self.ended = None
        if not submitted:
            self.lose(self.start)

    def lose(self, now, grace=0.0):
        self.dead = self.kernel.kill(grace)
        self.ended = now

    def check(self, now):
        if self.ended is not None:
            return
        if has_exited(self.kernel.pid):
            self.lose(now)
            return
        self.timed_out = self.timed_out or now >= self.deadline
        if self.timed_out and self.kill_on_timeout:
            self.killed = True
            self.lose(now)
            return
        if self.timed_out and self.started and not self.interrupted:
            self.kernel.interrupt()
            self.interrupted = True
        if now >= self.deadline + INTERRUPT_GRACE:
            self.killed = True
            self.lose(now)

    def timer(self):
        if self.ended is not None:
            return self.ended + EXIT_GRACE
        return self.deadline + INTERRUPT_GRACE if self.timed_out else self.deadline

    def fds(self):
        return () if self.ended is not None else (self.kernel.fileno(),)

    def on_ready(self, ready):
        if self.ended is not None or self.kernel.fileno() not in ready:
            return
        try:
            messages = self.kernel.read_messages()
        except KernelLost:  # usually it is exiting; else the code broke the channel
            self.lose(time.monotonic(), grace=0.1)
            return
        for message in messages:
            if message == "started":
                self.started = True
                if self.interrupt_asked:
                    self.kernel.interrupt()
            elif isinstance(message, tuple):
                self.take(*message)
            else:
                self.status = message
                self.ended = time.monotonic()

    def take(self, word, value):
        """A rich output or the exec's additions, from a channel the code can also write to:
        only their shape is taken. A rich output is answered once passed on (the kernel waits
        for that, so that the code's output keeps its order)."""
        if word == "display":
            try:
                self.pass_on(value)
            finally:
                try:
                    self.kernel.sock.sendall(b"k")
                except OSError:
                    pass
        elif isinstance(value, dict) and self.on_display is not None:
            self.rich = {
                "error": error_shape(value.get("error")),
                "results_truncated": value.get("results_truncated") is True,
            }

    def pass_on(self, value):
        if not (isinstance(value, dict) and self.on_display is not None):
            return
        if value.get("kind") in ("value", "display") and isinstance(value.get("data"), dict):
            self.on_display({"kind": value["kind"], "data": value["data"]})

    def interrupt(self):
        """SIGINT, as Ctrl-C: KeyboardInterrupt in the code, the session kept."""
        if self.ended is not None:
            return
        if self.started:
            self.kernel.interrupt()
        else:
            self.interrupt_asked = True

    def cancel(self):
        """Ends the exec as its timeout would (SIGINT, then a kill past the grace), but
        reported as cancelled, not timed out (unless its time was up already)."""
        now = time.monotonic()
        self.cancelled = not self.timed_out and now < self.deadline
        self.deadline = min(self.deadline, now)

    def abort(self):
        if self.ended is None:
            self.lose(time.monotonic())

    def outcome(self):
        code, sig = status_fields(self.dead)
        if self.status is not None and not self.timed_out:
            code = clamp_exit_code(self.status)
        return {
            "exit_code": code,
            "signal": sig,
            "timed_out": self.timed_out and not self.cancelled,
            "duration_ms": int((self.ended - self.start) * 1000),
            "usage": self.kernel.usage if self.status is not None else None,
            "cancelled": self.cancelled,
            **self.rich,
        }


def error_shape(error):
    """The error as data if it has the shape of one ({"name", "value", "traceback"}), else None."""
    if not isinstance(error, dict):
        return None
    name, value, lines = error.get("name"), error.get("value"), error.get("traceback")
    if not (isinstance(name, str) and isinstance(value, str) and isinstance(lines, list)):
        return None
    return {"name": name, "value": value, "traceback": [str(line) for line in lines]}


# --- The kernel, inside ---------------------------------------------------------------------
#
# The kernel is forked from the agent. It runs in its own session, with fds 0, 1 and 2 on
# /dev/null and every other inherited fd closed except its end of a Unix socketpair. Per exec
# the agent sends over that socket a HEADER_SIZE-digit length with three fds attached
# (SCM_RIGHTS: the exec's stdin, stdout and stderr pipes), then the request as JSON
# ({"code", "one_shot", "rich", "limit", "figures", "reseed"}). The kernel dup2s the fds onto
# 0, 1 and 2, answers "started\n" once SIGINT would interrupt the code, runs it, flushes, puts 0,
# 1 and 2 back on /dev/null (so the pipes reach EOF) and answers "exit <status> <cpu_ns>
# <peak>\n". A rich exec (a session's, or a rich one-shot) also sends "display <json>\n"
# for each rich output as it comes (and waits for the agent's one-byte answer), and
# "ended <json>\n" (the error as data, whether outputs were dropped) before its exit line.
# Between execs SIGINT is ignored, so a late one is harmless.


class KernelState:
    """What survives between execs: the namespace and the code's own SIGINT handler."""

    def __init__(self):
        main = type(sys)("__main__")
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        self.namespace = main.__dict__
        self.sigint = signal.default_int_handler
        self.pid = os.getpid()


def kernel_process(sock, cwd, user):
    """Body of the forked kernel (as "default" or "user"); never returns into the agent's
    code."""
    status = 70
    try:
        kernel_setup(sock, cwd)
        if user == "user":
            become_user()
        kernel_loop(sock)
        status = 0
    finally:
        os._exit(status)


def kernel_setup(sock, cwd):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()
    stdio_to_devnull()
    keep = sock.fileno()
    try:
        top = os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        top = 65536
    os.closerange(3, keep)
    os.closerange(keep + 1, max(top, keep + 1))
    try:
        os.chdir(cwd)
    except OSError:
        pass
    sys.argv = [""]
    sys.stdout = sys.__stdout__ = output_stream(1)
    sys.stderr = sys.__stderr__ = output_stream(2)


def kernel_loop(sock):
    state = KernelState()
    while True:
        request = receive_exec(sock)
        if request is None:
            return
        exec_request, fds = request
        before = cpu_ns()
        status = run_exec(sock, state, exec_request, fds)
        peak = max(resource.getrusage(who).ru_maxrss for who in RUSAGE_BOTH) * 1024
        sock.sendall(b"exit %d %d %d\n" % (status, cpu_ns() - before, peak))


RUSAGE_BOTH = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)


def cpu_ns():
    """CPU time of this process and its reaped children: an exec's is the difference."""
    return sum(
        int((r.ru_utime + r.ru_stime) * 1e9) for r in map(resource.getrusage, RUSAGE_BOTH)
    )


def exit_line(line):
    """(b"exit", status, usage or None) of "exit S [CPU_NS PEAK_BYTES]"; status None if bad."""
    word, *numbers = line.split(b" ")
    if len(numbers) not in (1, 3) or not all(n.lstrip(b"-").isdigit() for n in numbers):
        return word, None, None
    values = [int(n) for n in numbers]
    usage = None
    if len(values) == 3:
        usage = {"cpu_ns": max(values[1], 0), "max_rss_bytes": max(values[2], 0)}
    return word, values[0], usage


def receive_exec(sock):
    """The next (request, [stdin, stdout, stderr]) from the agent; None once it is gone."""
    header, fds, _, _ = recv_fds(sock, HEADER_SIZE, 3)
    if not header:
        return None
    header += recv_exactly(sock, HEADER_SIZE - len(header))
    request = json_loads(recv_exactly(sock, int(header)).decode("utf-8", "surrogatepass"))
    if len(fds) != 3:
        raise KernelLost("an exec request came without its three fds")
    return request, fds


def recv_exactly(sock, size):
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("the agent went away mid-request")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def run_exec(sock, state, request, fds):
    install_stdio(fds)
    code = request["code"]
    announce = lambda: sock.sendall(b"started\n")  # noqa: E731
    one_shot, with_rich = request["one_shot"], request["rich"]
    if one_shot:
        # A one-shot run (the warm pool) must look like `python3 -c` to the code, and gets
        # what a cold one gets: no rich results, unless the run asked for them.
        sys.argv = ["-c"]
        sys.stdout = sys.__stdout__ = output_stream(1, unbuffered=True)
        sys.stderr = sys.__stderr__ = output_stream(2, unbuffered=True)
        reseed_generators()
    else:
        if not SEEDED or request.get("reseed"):
            # A session's kernel may be a microVM clone's, whose generators are its
            # snapshot's: its first exec seeds them as a fresh interpreter's would be; and
            # so does its first after a resume.
            reseed_generators()
        see_new_packages()
    runner = plain_run
    if with_rich:
        rich = rich_module(request.get("rich_source"))
        rich.begin(sock, request)
        runner = rich.run
    status, error = run_code(code, state, announce, "<string>" if one_shot else "<session>", runner)
    flush_std_streams()
    if os.getpid() != state.pid:  # a fork made by the code ends with the code, as in python3 -c
        os._exit(status & 0xFF)
    if with_rich:
        ended = rich.end(error, user_traceback(error))
        sock.sendall(b"ended " + json_dumps(ended).encode("ascii") + b"\n")
        flush_std_streams()
    stdio_to_devnull()
    return status


USER_SITE_PTH = set()  # the .pth files of the user site this kernel has processed


def see_new_packages():
    """Lets a session's code import what ``pip install`` (``--user`` too, by a shell exec of
    either user) put in place since the kernel started: the user site (``$HOME/.local``:
    /workspace's, where pip installs when the system's site-packages is read-only) on
    ``sys.path`` even before it exists (``site`` leaves it out then), ahead of the system's;
    once it exists, ``site.addsitedir`` of it whenever it has .pth files not yet processed
    (what ``site`` does at start-up for a user site that exists); and the import system's
    caches of directories dropped."""
    import importlib
    import site

    if site.ENABLE_USER_SITE:
        user = site.getusersitepackages()
        if user not in sys.path:
            system = [i for i, p in enumerate(sys.path) if p.endswith("-packages")]
            sys.path.insert(system[0] if system else len(sys.path), user)
        try:
            pth = {n for n in os.listdir(user) if n.endswith(".pth")}
        except OSError:
            pth = set()
        if not pth <= USER_SITE_PTH:
            USER_SITE_PTH.update(pth)
            site.addsitedir(user)  # already on sys.path: this processes its .pth files
    importlib.invalidate_caches()


RICH = None  # rich.py, once a session exec has loaded it


def rich_module(source):
    """rich.py as a module of this kernel, compiled on its first session exec, whose request
    carries the source (the kernel was forked before the agent had it)."""
    global RICH
    if RICH is None:
        RICH = lazy_module("rich", source=source)
        RICH.setup()
    return RICH


def lazy_source(name):
    """The source of one of the lazy modules: as defined, or beside this file when it is run
    as a file (its tests)."""
    if name in LAZY_SOURCES:
        return LAZY_SOURCES[name]
    if "__file__" not in globals():
        raise BadRequest(f"no {name} module: the server defines it first")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")) as f:
        return f.read()


def lazy_module(name, given=None, source=None):
    """A lazy module compiled, with the names in given put in it first."""
    source = lazy_source(name) if source is None else source
    module = type(sys)(f"kennel_{name}")
    module.__dict__.update(given or {})
    exec(compile(source, f"<kennel-{name}>", "exec", dont_inherit=True), module.__dict__)
    return module


SEEDED = False  # whether this kernel has seeded its generators since it started


def reseed_generators():
    """Seeds Python's and numpy's global generators from the kernel's pool, as a fresh
    ``python3 -c`` would be: a microVM clone's kernel was started before its snapshot, and
    every clone of it would otherwise draw the same numbers."""
    global SEEDED
    import random

    SEEDED = True
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def plain_run(code, namespace, filename):
    exec(compile(code, filename, "exec", dont_inherit=True), namespace)


def run_code(code, state, announce, filename, runner=plain_run):
    """Runs the code like ``python3 -c``: (its exit status, the exception it ended with)."""
    error = None
    try:
        signal.signal(signal.SIGINT, state.sigint)
        announce()
        runner(code, state.namespace, filename)
    except BaseException as exc:
        error = exc
    # Ignore SIGINT again, keeping the code's handler for the next exec. signal.signal() runs
    # the handler of a SIGINT still pending first: that late KeyboardInterrupt is the code's.
    while True:
        try:
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
            break
        except KeyboardInterrupt as exc:
            error = error or exc
    state.sigint = signal.default_int_handler if handler is None else handler
    return exit_status(error), error


def exit_status(error):
    """The exit status for how the code ended, printing what python3 would print."""
    if error is None:
        return 0
    if not isinstance(error, SystemExit):
        print_exception(error)
        return 1
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    try:
        print(error.code, file=sys.stderr)
    except Exception:
        pass
    return 1


def user_traceback(error):
    """The error's traceback without the kernel's own frames at its top."""
    if error is None:
        return None
    kernel = (run_code.__code__, plain_run.__code__, *(RICH.KERNEL_CODES if RICH else ()))
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code in kernel:
        tb = tb.tb_next
    return tb


def print_exception(error):
    """Prints the traceback as python3 would, without the kernel's own frames."""
    import traceback

    try:
        traceback.print_exception(type(error), error, user_traceback(error), file=sys.stderr)
    except Exception:
        try:
            os.write(2, f"{type(error).__name__}: (traceback unavailable)\n".encode())
        except OSError:
            pass


def install_stdio(fds):
    """Puts the exec's pipes on fds 0, 1 and 2, with fresh Python streams where needed."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = sys.__stdin__ = io.open(0, "r", encoding="utf-8", errors="surrogateescape", closefd=False)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        for attr in (name, f"__{name}__"):
            stream = getattr(sys, attr, None)
            if stream is None or getattr(stream, "closed", False):
                setattr(sys, attr, output_stream(fd))


def output_stream(fd, unbuffered=False):
    """A text stream on fd, with python3's error handler for it: line-buffered for a session
    (the agent's -u streams would write every piece of a print() separately: many tiny output
    events), or unbuffered as ``python3 -u`` has it, which is how a cold run runs python."""
    errors = "surrogateescape" if fd == 1 else "backslashreplace"
    raw = io.FileIO(fd, "w", closefd=False)
    if unbuffered:
        return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)
    raw = io.BufferedWriter(raw)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, line_buffering=True)


def flush_std_streams():
    for attr in ("stdout", "stderr", "__stdout__", "__stderr__"):
        try:
            getattr(sys, attr).flush()
        except Exception:
            pass


def stdio_to_devnull():
    fd = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        if fd != target:
            os.dup2(fd, target)
    if fd > 2:
        os.close(fd)


# --- The kernel, from the agent -----------------------------------------------------------


class Kernel:
    """The agent's handle on a kernel process."""

    def __init__(self, pid, sock):
        self.pid = pid
        self.sock = sock
        self.buffer = b""
        self.alive = True
        self.wait_status = None
        self.killed_running = False
        self.usage = None  # what the last exec used, by the kernel's own account
        self.rich_sent = False  # whether an exec request carried rich.py's source to it
        self.reseed = False  # whether its generators are to be seeded afresh (a resume)

    @classmethod
    def start(cls, cwd, user="default"):
        ours, theirs = socketpair()
        try:
            pid = os.fork()
        except BaseException:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            ours.detach()  # its fd is closed with the rest; the object must not close it later
            kernel_process(theirs, cwd, user)
        theirs.close()
        return cls(pid, ours)

    def fileno(self):
        return self.sock.fileno()

    def submit(self, request, fds):
        """Sends an exec ({"code", "one_shot", "rich", ...}); False if the kernel is
        gone."""
        data = json_dumps(request).encode("ascii")
        header = str(len(data)).zfill(HEADER_SIZE)
        try:
            send_fds(self.sock, [header.encode()], fds)
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def read_messages(self):
        """What the kernel said since last time: "started", ("display", output),
        ("ended", additions) and/or an exit status (int)."""
        try:
            data = self.sock.recv(READ_SIZE, _socket.MSG_DONTWAIT)
        except BlockingIOError:
            return []
        except OSError as exc:
            raise KernelLost(str(exc)) from exc
        if not data:
            raise KernelLost("the control channel closed")
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        if len(self.buffer) > KERNEL_LINE_MAX:
            raise KernelLost("a line longer than the agent takes")
        return [self.parse(line) for line in lines]

    def parse(self, line):
        if line == b"started":
            return "started"
        word, _, rest = line.partition(b" ")
        if word in (b"display", b"ended"):
            try:
                return word.decode(), json_loads(rest)
            except ValueError as exc:
                raise KernelLost(f"a bad {word.decode()} message: {exc}") from exc
        word, status, usage = exit_line(line)
        if word != b"exit" or status is None:
            raise KernelLost(f"unexpected message {line[:80]!r}")
        self.usage = usage
        return status

    def interrupt(self):
        try:
            os.kill(self.pid, signal.SIGINT)
        except OSError:
            pass

    def kill(self, grace=0.0):
        """Kills the kernel and its process group, reaps it; returns its wait status. A kernel
        that is not dying on its own within grace seconds counts as killed_running."""
        if self.alive:
            self.alive = False
            give_up = time.monotonic() + grace
            while not has_exited(self.pid) and time.monotonic() < give_up:
                time.sleep(0.005)
            self.killed_running = not has_exited(self.pid)
            kill_group(self.pid)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.wait_status = os.waitpid(self.pid, 0)[1]
            except ChildProcessError:
                pass
            self.sock.close()
        return self.wait_status

    def is_running(self):
        return self.alive and not has_exited(self.pid)


# --- File operations ----------------------------------------------------------------------


SYMLINK_REFUSED = "is or passes through a symlink; not followed"


def symlink_refused():
    return OSError(errno.ELOOP, SYMLINK_REFUSED)


def open_parent(path, create=False):
    """(fd of path's directory, path's last component), for an absolute, normalised path.

    The one rule of every file op (and of a pooled run's collect, which reads): the path is
    walked from / one component at a time with O_NOFOLLOW, so a directory on the way that is
    a symlink is refused (ELOOP), exactly as the native tier's collect refuses it
    (openat2 RESOLVE_NO_SYMLINKS). With create, missing directories are made (0o777 less the
    umask, as os.makedirs). The caller closes the fd.
    """
    *dirs, name = path.strip("/").split("/")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            inner = open_dir_step(fd, part, create)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def open_dir_step(fd, name, create):
    """The directory name within fd, never through a symlink (O_PATH: no read permission is
    needed to pass through, as for path resolution)."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        inner = os.open(name, flags, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o777, dir_fd=fd)
        except FileExistsError:  # made meanwhile: opened and checked below
            pass
        inner = os.open(name, flags, dir_fd=fd)
    mode = os.fstat(inner).st_mode
    if stat.S_ISDIR(mode):
        return inner
    os.close(inner)
    if stat.S_ISLNK(mode):
        raise symlink_refused()
    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))


def open_last(fd, name, flags):
    """name within fd, opened with flags and O_NOFOLLOW: a symlink is refused (ELOOP)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and is_symlink(fd, name)):
            raise symlink_refused() from None
        raise


def is_symlink(fd, name):
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def write_file(path, data, mode):
    """Replaces path with data: a temporary file in the same directory, then a rename."""
    fd, name = open_parent(path, create=True)
    try:
        if is_symlink(fd, name):
            raise symlink_refused()
        temp = f".kennel-write-{os.getpid()}-{next(_TEMP_NAMES)}"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            try:
                write_all(out, data)
                os.fchmod(out, mode)
            finally:
                os.close(out)
            # A symlink put at name meanwhile is replaced by the rename, never followed.
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=fd)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def read_file(path, limit):
    """(total size, first limit bytes, truncated) of a regular file reached without symlinks."""
    parent, name = open_parent(path)
    try:
        fd = open_last(parent, name, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = read_up_to(fd, limit + 1)
    finally:
        os.close(fd)
    truncated = len(data) > limit or st.st_size > limit
    return max(st.st_size, len(data)), data[:limit], truncated


def read_up_to(fd, size):
    chunks = []
    while size > 0:
        chunk = os.read(fd, min(size, REQUEST_READ_SIZE))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def delete_path(path):
    """Removes path: a file or a symlink itself, or a directory with all in it (shutil's
    fd-based walk, which removes symlinks without following them)."""
    fd, name = open_parent(path)
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            import shutil

            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def list_dir(path):
    parent, name = open_parent(path)
    try:
        fd = open_last(parent, name, os.O_RDONLY | os.O_DIRECTORY)
    finally:
        os.close(parent)
    try:
        with os.scandir(fd) as entries:
            described = [describe_entry(entry) for entry in entries]
    finally:
        os.close(fd)
    return sorted((e for e in described if e is not None), key=lambda e: e["name"])


def describe_entry(entry):
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:  # deleted meanwhile
        return None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        kind = "dir"
    elif stat.S_ISREG(mode):
        kind = "file"
    elif stat.S_ISLNK(mode):
        kind = "symlink"
    else:
        kind = "other"
    name = entry.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return {"name": name, "type": kind, "size": st.st_size, "mode": stat.S_IMODE(mode)}


# --- The agent ----------------------------------------------------------------------------


def parse_request(line):
    """The request object of a line and its id; BadRequest if either is unusable."""
    try:
        request = json_loads(line)
    except (ValueError, RecursionError):
        raise BadRequest("the request is not valid JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the request must be a JSON object")
    return request, field(request, "id", int)


class Agent:
    """Serves the requests on stdin, one at a time, and owns the kernel."""

    def __init__(self):
        self.cwd = "/workspace" if os.path.isdir("/workspace") else os.getcwd()
        self.wakeup_fd = watch_children()
        self.requests = LineReader(0)
        self.ops = {
            "define": self.op_define,
            "interrupt": self.op_idle_control,
            "cancel": self.op_idle_control,
            "exec": self.op_exec,
            "write": self.op_write,
            "read": self.op_read,
            "delete": self.op_delete,
            "list": self.op_list,
            "pack": self.op_pack,
            "unpack": self.op_unpack,
            "ping": self.op_ping,
            "boot": self.op_boot,
            **{op: getattr(self, f"op_{op}") for op in BACKGROUND_OPS},
        }
        self.kernels = dict.fromkeys(USERS)  # each user's python, "user"'s from its first exec
        self.archive_module = None
        self.processes = None  # procs.py's Processes, once a process is started
        self.watches = None  # watch.py's Watches, once a watch is made
        # Reads that wait for news, answered when it comes or their wait is over:
        # [(deadline, rid, has_news, answer)].
        self.parked = []
        # What shell execs carry from one to the next, as a terminal does: cd and export; each
        # user's apart ("user"'s from its first shell exec).
        self.shells = {"default": (self.cwd, dict(os.environ)), "user": None}
        try:
            self.start_kernel("default")
        except OSError as exc:
            print(f"agent: cannot start the kernel: {exc}", file=sys.stderr)

    def serve(self):
        while True:
            line = self.requests.next_line()
            if line is None:
                if self.requests.eof:
                    return
                self.wait_idle()
            elif line.strip():
                self.handle(line)

    def wait_idle(self):
        """Waits, between requests, for the next one, while background processes are served:
        their output drained, their stdin fed, their ends reaped, their timeouts kept."""
        reads, writes = self.background_fds()
        poller = select.poll()
        for fd in (0, self.wakeup_fd, *reads):
            poller.register(fd, select.POLLIN)
        for fd in writes:
            poller.register(fd, select.POLLOUT)
        now = time.monotonic()
        for fd, _ in poller.poll(poll_timeout(now, self.background_timer())):
            if fd == 0:
                self.requests.fill()
            elif fd == self.wakeup_fd:
                drain(fd)
            else:
                self.background_ready(fd)
        self.check_background()
        self.serve_parked()

    def background(self):
        """What the agent serves beside requests: background processes and file watches."""
        return [b for b in (self.processes, self.watches) if b is not None]

    def background_fds(self):
        """(fds to read, fds to write) of what the agent serves in the background."""
        reads, writes = [], []
        for source in self.background():
            r, w = source.fds()
            reads.extend(r)
            writes.extend(w)
        return reads, writes

    def background_ready(self, fd):
        for source in self.background():
            source.on_ready(fd)

    def background_timer(self):
        timers = [b.timer() for b in self.background()]
        timers.extend(deadline for deadline, *_ in self.parked)
        return min((t for t in timers if t is not None), default=None)

    def park(self, rid, wait_ms, has_news, answer):
        """Holds a read's answer until ``has_news()`` or for ``wait_ms``: a follower that asks
        again at once is told of new output as soon as the agent reads it, without polling."""
        self.parked.append((time.monotonic() + wait_ms / 1000, rid, has_news, answer))

    def serve_parked(self):
        """Answers the parked reads that have news or have waited long enough."""
        if not self.parked:
            return
        now, waiting = time.monotonic(), []
        for entry in self.parked:
            deadline, rid, has_news, answer = entry
            try:
                if now >= deadline or has_news():
                    answer()
                else:
                    waiting.append(entry)
            except ProtocolClosed:
                raise
            except Exception as exc:
                send_failure(rid, exc)
        self.parked = waiting

    def check_background(self):
        for source in self.background():
            source.check(time.monotonic())

    def handle(self, line):
        rid = None
        try:
            request, rid = parse_request(line)
            op = self.ops.get(field(request, "op", str))
            if op is None:
                raise BadRequest("unknown op")
            op(rid, request)
        except ProtocolClosed:
            raise
        except Exception as exc:
            send_failure(rid, exc)

    @property
    def kernel(self):
        """The default user's kernel (what ``ping`` reports)."""
        return self.kernels["default"]

    def shutdown(self):
        for kernel in self.kernels.values():
            if kernel is not None:
                kernel.kill()
        if self.processes is not None:
            self.processes.kill_all()

    # --- kernel lifecycle

    def start_kernel(self, user):
        self.kernels[user] = None
        self.kernels[user] = Kernel.start(self.cwd, user)

    def restart_kernel(self, interpreter, crashed, why, user):
        try:
            self.start_kernel(user)
            restarted, outcome = True, "a fresh one was started (state lost)"
        except OSError as exc:
            restarted, outcome = False, f"starting a fresh one failed ({exc.strerror or exc})"
        interpreter.update(restarted=restarted, crashed=crashed, reason=f"the interpreter {why}; {outcome}")

    def live_kernel(self, interpreter, user):
        """``user``'s kernel to run an exec in, replacing one that died since the last exec, and
        started on the first ("user"'s is started lazily, once its ids are known to work)."""
        kernel = self.kernels[user]
        if kernel is not None and not kernel.is_running():
            status = kernel.kill()
            why = f"{describe(status)} between execs"
            self.restart_kernel(interpreter, crashed=True, why=why, user=user)
        if self.kernels[user] is None:
            if user == "user":
                user_ready()
            self.start_kernel(user)
        return self.kernels[user]

    # --- exec

    def op_exec(self, rid, request):
        kind = field(request, "kind", str)
        if field(request, "reseed", bool, False):
            # The sandbox was resumed: every kernel's generators are seeded afresh at its next
            # exec, as a clone's are at its first.
            for kernel in self.kernels.values():
                if kernel is not None:
                    kernel.reseed = True
        if kind == "shell":
            self.exec_shell(rid, request)
        elif kind == "python":
            self.exec_python(rid, request)
        else:
            raise BadRequest("field 'kind' must be 'shell' or 'python'")

    def exec_shell(self, rid, request):
        command = field(request, "command", str)
        shell = SHELLS.get(field(request, "shell", str, "bash"))
        if shell is None:
            raise BadRequest("field 'shell' must be 'bash' or 'sh'")
        timeout = count_field(request, "timeout_ms") / 1000
        limit = count_field(request, "output_limit")
        stdin = b64_field(request, "stdin_b64", None)
        user = user_field(request)
        shell_cwd, shell_env = self.shells[user] or (self.cwd, {**os.environ, **USER_ENV})
        env, creds = launch_as(user, shell_env, env_field(request))
        cwd = field(request, "cwd", str, None) or shell_cwd
        # A pooled one-shot run is `bash -c S` exactly, as a cold one: no state, no trap.
        state = None if field(request, "one_shot", bool, False) else state_pipe()
        inherited = state is not None and user != "default"
        script = command if state is None else keeping_state(command, state[1], inherited)
        import subprocess  # lazily: agent (and so kernel) start-up stays light

        child_fds, ours = make_pipes(stdin is not None)
        try:
            proc = subprocess.Popen(
                [shell, "-c", script],
                stdin=child_fds[0],
                stdout=child_fds[1],
                stderr=child_fds[2],
                env=env,
                cwd=cwd,
                close_fds=True,
                pass_fds=(state[1],) if inherited else (),
                start_new_session=True,
                **creds,
            )
        except BaseException:
            close_fds(ours)
            close_fds(state or ())
            raise
        finally:
            close_fds(child_fds)
        run = ShellRun(proc, timeout)
        pump = Pump(rid, limit, *ours, stdin)
        try:
            self.drive(run, pump)
            if state is not None:
                self.keep_shell_state(state[0], user)
        finally:
            close_fds(state or ())
        send({"id": rid, "event": "result", **run.outcome(), **pump.totals(), "interpreter": None})

    def keep_shell_state(self, fd, user):
        """Takes the cwd and environment the shell left (its EXIT trap wrote them before it
        ended), if it left them: a shell that was killed or exec'd another program keeps the
        state from before."""
        os.set_blocking(fd, False)
        data, _ = read_available(fd, SHELL_STATE_MAX)
        cwd, *pairs = data.split(b"\0")
        if not data.endswith(b"\0") or not pairs or not os.path.isdir(cwd):
            return  # none, or cut short
        env = {}
        for pair in pairs:
            name, sep, value = pair.partition(b"=")
            if sep and name and name.decode("utf-8", "replace") not in SHELL_NOT_KEPT:
                env[os.fsdecode(name)] = os.fsdecode(value)
        self.shells[user] = (os.fsdecode(cwd), env)

    def exec_python(self, rid, request):
        code = field(request, "code", str)
        timeout = count_field(request, "timeout_ms") / 1000
        limit = count_field(request, "output_limit")
        stdin = b64_field(request, "stdin_b64", None)
        one_shot = field(request, "one_shot", bool, False)
        with_rich = not one_shot or field(request, "rich", bool, False)
        figures = field(request, "figure_formats", list, ["png"])
        if not all(f in FIGURE_FORMATS for f in figures):
            raise BadRequest("field 'figure_formats' may hold only 'png' and 'svg'")
        user = user_field(request)
        interpreter = {"restarted": False, "crashed": False, "reason": None}
        kernel = self.live_kernel(interpreter, user)
        to_kernel = {"code": code, "one_shot": one_shot, "rich": with_rich, "limit": limit,
                     "figures": figures, "reseed": kernel.reseed}
        kernel.reseed = False
        if with_rich and not kernel.rich_sent:
            to_kernel["rich_source"] = lazy_source("rich")
        child_fds, ours = make_pipes(stdin is not None)
        try:
            submitted = kernel.submit(to_kernel, child_fds)
        finally:
            close_fds(child_fds)
        kernel.rich_sent = kernel.rich_sent or "rich_source" in to_kernel
        pump = Pump(rid, limit, *ours, stdin)

        def display(output):
            pump.read_ready()  # the output the code wrote before this goes out before it
            send({"id": rid, "event": "display", "output": output})

        display = display if with_rich else None
        run = PythonRun(kernel, timeout, submitted, kill_on_timeout=one_shot, on_display=display)
        self.drive(run, pump)
        if not kernel.alive:
            if run.killed and one_shot:
                why = "was killed at the timeout (one-shot run)"
            elif run.killed:
                why = "did not stop within 2 s of SIGINT after the timeout and was killed"
            elif kernel.killed_running:
                why = "stopped answering on its control channel during the exec and was killed"
            else:
                why = f"{describe(run.dead)} during the exec"
            self.restart_kernel(interpreter, crashed=not run.killed, why=why, user=user)
        send({"id": rid, "event": "result", **run.outcome(), **pump.totals(), "interpreter": interpreter})

    def drive(self, run, pump):
        """The exec's event loop: until its process ended and its output is read. Requests
        that come meanwhile wait for it, but for ``interrupt`` and ``cancel``, which act on
        it at once."""
        try:
            self.take_requests(run, pump.rid, read=False)
            while True:
                now = time.monotonic()
                run.check(now)
                self.check_background()
                if run.ended is not None and (pump.eof or now >= run.ended + EXIT_GRACE):
                    return
                requests = () if self.requests.eof else (0,)
                reads, writes = self.background_fds()
                extra = (self.wakeup_fd, *requests, *run.fds(), *reads)
                timers = [t for t in (run.timer(), self.background_timer()) if t is not None]
                ready = pump.poll(poll_timeout(now, min(timers, default=None)), extra, writes)
                if self.wakeup_fd in ready:
                    drain(self.wakeup_fd)
                if 0 in ready:
                    self.take_requests(run, pump.rid)
                for fd in ready.intersection((*reads, *writes)):
                    self.background_ready(fd)
                self.serve_parked()
                run.on_ready(ready)
        finally:
            run.abort()  # a no-op unless the loop failed
            pump.close()

    def take_requests(self, run, running, read=True):
        for line in self.requests.take_ready(read):
            try:
                request, rid = parse_request(line)
                op = request.get("op")
            except BadRequest:
                op = None
            if op in CONTROL_OPS:
                if request.get("target") in (None, running):
                    getattr(run, op)()
                send({"id": rid, "event": "ok"})
            elif op in IMMEDIATE_OPS:
                self.handle(line)
            else:
                self.requests.queued.append(line)

    # --- background processes (procs.py)

    def process_table(self, request=None):
        """procs.py's table, compiled on the first start, with the agent's helpers."""
        if self.processes is None:
            if request is None:
                raise ProcessLookupError(errno.ESRCH, "no such process")
            names = (read_available, feed_pipe, signal_group, status_fields, close_fds)
            module = lazy_module("procs", {f.__name__: f for f in names})
            self.processes = module.Processes(count_field(request, "max_processes"),
                                              count_field(request, "max_terminals", 0))
        return self.processes

    def process(self, request):
        """The background process a request names by ``pid``: ESRCH for any other pid (the
        agent, the kernel, an exec's processes, what is not ours)."""
        pid = count_field(request, "pid")
        try:
            return self.process_table().get(pid)
        except LookupError:
            raise ProcessLookupError(errno.ESRCH, f"no process {pid} started by this session") from None

    def op_start(self, rid, request):
        argv = field(request, "argv", list)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise BadRequest("field 'argv' must be a non-empty list of strings")
        env, creds = launch_as(user_field(request), dict(os.environ), env_field(request))
        cwd = field(request, "cwd", str, None) or self.cwd
        timeout_ms = count_field(request, "timeout_ms", None)
        timeout = None if timeout_ms is None else timeout_ms / 1000
        table = self.process_table(request)
        tty = field(request, "tty", dict, None)
        if tty is not None:
            tty = (count_field(tty, "cols"), count_field(tty, "rows"))
        terminal = field(request, "terminal", bool, False)
        with_stdin = field(request, "stdin", bool, False)
        try:
            process = table.start(argv, cwd, env, with_stdin, timeout, tty, terminal, creds)
        except OverflowError as exc:
            send_error(rid, "EAGAIN", str(exc))
            return
        send({"id": rid, "event": "started", **process.describe()})

    def op_procs(self, rid, request):
        self.check_background()
        table = self.processes.by_pid.values() if self.processes is not None else ()
        send({"id": rid, "event": "procs", "procs": [p.describe() for p in table]})

    def op_proc_read(self, rid, request):
        """A process's output from the offsets asked for (or its last ``tail`` bytes of each
        stream), at most ``max_bytes`` of each; with ``wait_ms``, a read with nothing new is
        answered once there is, or after that long."""
        process = self.process(request)
        self.check_background()
        limit = count_field(request, "max_bytes")
        tail = count_field(request, "tail", None)
        if tail is not None:
            offsets = (max(0, process.out.end - tail), max(0, process.err.end - tail))
        else:
            offsets = (count_field(request, "stdout_offset"), count_field(request, "stderr_offset"))
        wait_ms = count_field(request, "wait_ms", None)

        def answer():
            send_proc_output(rid, process, offsets, limit)

        if wait_ms and not process.has_news(offsets):
            self.park(rid, wait_ms, lambda: process.has_news(offsets), answer)
        else:
            answer()

    def op_proc_stdin(self, rid, request):
        process = self.process(request)
        data = b64_field(request, "b64", None) or b""
        self.processes.write_stdin(process, data, field(request, "eof", bool, False))
        send({"id": rid, "event": "ok"})

    def op_proc_signal(self, rid, request):
        process = self.process(request)
        sig = count_field(request, "signal")
        if process.running:
            os.kill(process.pid, sig)
        send({"id": rid, "event": "ok"})

    def op_proc_kill(self, rid, request):
        process = self.process(request)
        self.processes.kill(process)  # the process and what is left of its group and session
        send({"id": rid, "event": "ok"})

    def op_proc_resize(self, rid, request):
        process = self.process(request)
        process.resize((count_field(request, "cols"), count_field(request, "rows")))
        send({"id": rid, "event": "ok"})

    # --- file watches (watch.py)

    def watch_table(self, request=None):
        """watch.py's table, compiled on the first watch."""
        if self.watches is None:
            if request is None:
                raise ProcessLookupError(errno.ESRCH, "no such watch")
            self.watches = lazy_module("watch").Watches(count_field(request, "max_watches"))
        return self.watches

    def op_watch(self, rid, request):
        path = path_field(request, allow_root=True)
        recursive = field(request, "recursive", bool, False)
        watch = self.watch_table(request).start(path, recursive)
        send({"id": rid, "event": "watching", "wid": watch.wid})

    def op_watch_read(self, rid, request):
        """A watch's events from number ``from``; with ``wait_ms``, a read that finds none is
        answered once there is one, or after that long."""
        watch = self.watch_table().get(count_field(request, "wid"))
        watch.read_kernel()
        start, limit = count_field(request, "from"), count_field(request, "max_events")

        def answer():
            events, after, dropped = watch.read(start, limit)
            send({"id": rid, "event": "watch_events", "events": events, "next": after,
                  "dropped": dropped})

        if count_field(request, "wait_ms", None) and watch.next <= start:
            self.park(rid, request["wait_ms"], lambda: watch.next > start, answer)
        else:
            answer()

    def op_unwatch(self, rid, request):
        self.watch_table().stop(count_field(request, "wid"))
        send({"id": rid, "event": "ok"})

    # --- files

    def op_write(self, rid, request):
        path = path_field(request)
        data = b64_field(request, "b64")
        mode = field(request, "mode", int, 0o644)
        if not 0 <= mode <= 0o7777:
            raise BadRequest("field 'mode' must be between 0 and 4095")
        write_file(path, data, mode)
        send({"id": rid, "event": "ok", "size": len(data)})

    def op_read(self, rid, request):
        path = path_field(request)
        size, data, truncated = read_file(path, count_field(request, "max_bytes"))
        send({"id": rid, "event": "file", "size": size, "truncated": truncated, "b64": b64(data)})

    def op_delete(self, rid, request):
        delete_path(path_field(request))
        send({"id": rid, "event": "ok"})

    def op_list(self, rid, request):
        entries = list_dir(path_field(request, allow_root=True))
        send({"id": rid, "event": "entries", "entries": entries})

    def op_pack(self, rid, request):
        path, limit = path_field(request, allow_root=True), count_field(request, "max_bytes")
        data = self.archive().pack(path, limit)
        send({"id": rid, "event": "file", "size": len(data), "truncated": False, "b64": b64(data)})

    def op_unpack(self, rid, request):
        path = path_field(request, allow_root=True)
        data, limit = b64_field(request, "b64"), count_field(request, "max_bytes")
        written = self.archive().unpack(path, data, limit)
        send({"id": rid, "event": "ok", "size": written})

    def archive(self):
        """archive.py, compiled on the first pack or unpack, with the file ops' path rules."""
        if self.archive_module is None:
            given = {f.__name__: f for f in (open_parent, open_dir_step, write_file)}
            self.archive_module = lazy_module("archive", given)
        return self.archive_module

    def op_define(self, rid, request):
        sources = field(request, "sources", dict)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items()):
            raise BadRequest("field 'sources' must map names to source text")
        LAZY_SOURCES.update(sources)
        send({"id": rid, "event": "ok"})

    def op_idle_control(self, rid, request):
        send({"id": rid, "event": "ok"})  # no exec runs: nothing to interrupt or cancel

    def op_boot(self, rid, request):
        pass  # the agent itself, read by the boot program; sent again to a resumed or restored agent

    def op_ping(self, rid, request):
        kernel = self.kernel
        pid = kernel.pid if kernel is not None and kernel.is_running() else None
        send({"id": rid, "event": "pong", "pid": os.getpid(), "kernel_pid": pid})


def preload(names):
    """Imports the image's preload modules ahead of the first request."""
    import importlib

    for name in filter(None, names.split(",")):
        try:
            importlib.import_module(name)
        except Exception as exc:  # the code's own import reports it as a cold run would
            print(f"kennel agent: cannot preload {name}: {exc!r}", file=sys.stderr)


def main():
    if len(sys.argv) > 1:
        preload(sys.argv[1])
    agent = Agent()
    try:
        agent.serve()
    except ProtocolClosed:
        pass
    finally:
        agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
