"""The synchronous client: :class:`Client`, :class:`Session` and :class:`Stream`."""

from __future__ import annotations

import shlex
import time
from typing import (Any, Callable, Dict, Generic, Iterator, List, Mapping, Optional, Sequence,
                    TypeVar, Union)

import httpx

from . import _common as c
from .errors import KennelError, NotFound
from .results import (ExecResult, FileEntry, FileEvent, OutputChunk, PauseInfo, ProcessEvent,
                      PortInfo, ProcessInfo, ResumeReport, RunInfo, RunResult, SessionInfo,
                      SnapshotInfo, VolumeInfo)
from .terminal import Terminal, Terminals, attach_process

R = TypeVar("R")

DEFAULT_URL = "http://127.0.0.1:8080"


class Stream(Generic[R]):
    """A streamed run or exec: iterate it for :class:`OutputChunk` objects as the code writes
    them (and, for a python session exec, :class:`RichOutput` ones as they are shown); once
    iteration ends, :attr:`result` holds the final :class:`RunResult` (for
    ``Client.stream_code``/``stream_command``) or :class:`ExecResult` (for ``Session.stream``).

    Reading :attr:`result` before the stream is done reads (and drops) the rest of the output
    first. A stream that ends with an ``error`` event raises :class:`KennelError` from the
    iteration (or from :attr:`result`). Use it as a context manager, or call :meth:`close`,
    to free the connection if you stop early.

    >>> with client.stream_code("print('hi')") as stream:
    ...     for chunk in stream:
    ...         print(chunk.stream, chunk.text, end="")
    ... print(stream.result.exit_code)
    """

    def __init__(self, response: httpx.Response, parse: Callable[[Dict[str, Any]], R]):
        self._response = response
        self._parse = parse
        self._result: Optional[R] = None
        self._error: Optional[KennelError] = None
        self._done = False
        self._outcome = c.Outcome()
        self._iter = self._events()

    def _events(self) -> Iterator[c.Piece]:
        parser = c.SSEParser()
        try:
            for line in self._lines():
                for piece in line.splitlines() or [""]:
                    ev = parser.feed(piece)
                    if ev is not None:
                        yield from self._handle(*ev)
                    if self._done:
                        return
            ev = parser.finish()
            if ev is not None:
                yield from self._handle(*ev)
        finally:
            self._response.close()
            if not self._done:
                self._done = True
                if self._error is None and self._result is None:
                    self._error = KennelError(None, "stream_ended",
                                              "the stream ended without a result")

    def _lines(self) -> Iterator[str]:
        """The stream's lines; a connection that breaks is a :class:`kennel.TransportError`."""
        try:
            yield from self._response.iter_lines()
        except httpx.TransportError as e:
            self._error = c.transport_error(self._response.request, e)
            self._done = True
            raise self._error from e

    def _handle(self, event: str, data: str) -> Iterator[c.Piece]:
        try:
            chunk, result = self._outcome.collect(event, data)
        except KennelError as e:
            self._error, self._done = e, True
            raise
        if chunk is not None:
            yield chunk
        elif result is not None:
            self._result, self._done = self._parse(result), True

    def __iter__(self) -> Iterator[c.Piece]:
        return self

    def __next__(self) -> c.Piece:
        return next(self._iter)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def result(self) -> R:
        """The final result, reading the rest of the stream first if need be."""
        return self.wait()

    def wait(self) -> R:
        """Reads the rest of the stream and returns the final result."""
        for _ in self._iter:
            pass
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def close(self) -> None:
        """Stops reading: the connection is closed (the run itself goes on in the server)."""
        self._iter.close()
        self._response.close()

    def __enter__(self) -> "Stream[R]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Watch:
    """A watch on a directory of the sandbox (``session.watch()``): iterate it for
    :class:`FileEvent` objects as files change. It is in place once ``session.watch()`` has
    returned, so every change after that shows. It lives as long as its connection:
    :meth:`close` it (or leave its ``with`` block, or ``break`` out and close) to end it. An
    ended session raises :class:`kennel.KennelError` from the iteration.

    >>> with s.watch("/workspace") as w:
    ...     s.write_file("a.txt", "hi")
    ...     print(next(w))        # FileEvent(kind="create", path="/workspace/a.txt", ...)
    """

    def __init__(self, client: "Client", request: httpx.Request):
        self._request = request
        self._response = client._send(request, stream=True)
        self._reader = c.WatchReader()
        self._queue: List[FileEvent] = []
        try:
            if self._response.status_code >= 400:
                raise c.error_from(self._response, self._response.read())
            self._lines = self._response.iter_lines()
            while not self._reader.ready:
                self._queue += self._reader.feed(self._next_line())
        except BaseException:
            self._response.close()
            raise

    @property
    def path(self) -> Optional[str]:
        """The watched directory, as the server resolved it."""
        return self._reader.path

    def _next_line(self) -> Optional[str]:
        """The stream's next line, None at its end; a broken connection raises a
        :class:`kennel.TransportError`."""
        try:
            return next(self._lines, None)
        except httpx.TransportError as e:
            raise c.transport_error(self._request, e) from e

    def __iter__(self) -> Iterator[FileEvent]:
        return self

    def __next__(self) -> FileEvent:
        while not self._queue:
            line = self._next_line()
            self._queue += self._reader.feed(line)
            if line is None and not self._queue:
                self.close()
                raise StopIteration
        return self._queue.pop(0)

    def close(self) -> None:
        """Ends the watch (the server removes it with its connection)."""
        self._response.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: How many times a process's output stream is opened again after its connection broke.
RECONNECTS = 3


class Network:
    """A session's network (``session.network``), which can change while it runs.

    :meth:`update` replaces the whole network (mode, allowlist, pins) under the checks of a
    creation: new connections follow it at once, and open ones to hosts it no longer allows
    are closed. :class:`kennel.Conflict` for a change the sandbox cannot take (to or from
    ``"full"``, or from ``"none"`` to an allowlist); :class:`kennel.BadRequest` for one a
    creation would refuse, which changes nothing.

    >>> s.network.update(["pypi.org", "files.pythonhosted.org"])   # install...
    >>> s.network.update("none")                                    # ...then lock
    """

    def __init__(self, session: "Session"):
        self._session = session

    def update(self, network: Any = None, *,
               resolve: Optional[Sequence[str]] = None) -> SessionInfo:
        """Replaces the session's network: a list of domains (mode ``allow``), a mode, or a
        dict as the API takes it; ``resolve`` pins names (``"NAME:IP"``). The session's info
        after the change."""
        r = self._session._client._request("PATCH", c.session_url(self._session.id, "/network"),
                                           json=c.network_update_body(network, resolve))
        self._session.info = SessionInfo.from_dict(r.json())
        return self._session.info


class Processes:
    """A session's background processes (``session.processes``): programs that keep running
    between calls (servers, watchers, long jobs) until they exit, are killed, their
    ``timeout`` passes or the session ends.

    >>> p = s.processes.start(cmd="python3 -m http.server 8000")
    >>> for ev in s.processes.output(p.pid):   # stdout/stderr events, then "exit"
    ...     print(ev.kind, ev.text)
    """

    def __init__(self, session: "Session"):
        self._session = session

    def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        return self._session._client._request(method, url, **kw)

    def start(self, argv: Optional[Sequence[str]] = None, cmd: Optional[str] = None, *,
              cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
              stdin: bool = False, timeout: c.Timeout = None,
              user: Optional[str] = None, tty: bool = False,
              cols: Optional[int] = None, rows: Optional[int] = None) -> ProcessInfo:
        """Starts ``argv``, or ``cmd`` as a bash command line; ``stdin=True`` gives it a stdin
        to :meth:`write_stdin` to (else it reads /dev/null); ``timeout`` (seconds or "10m")
        kills it after that long; ``user="user"`` runs it as uid 1000, as
        :meth:`Session.run_code`. ``tty=True`` runs it on a pty of ``cols`` x ``rows``
        (stdout carries all its output; :meth:`attach` types into it).
        :class:`kennel.BadRequest` for a program or ``cwd`` that cannot start,
        :class:`kennel.Busy` past the server's processes per session."""
        body = c.process_body(argv, cmd, cwd, env, stdin, timeout, user, tty, cols, rows)
        r = self._request("POST", c.process_url(self._session.id), json=body)
        return ProcessInfo.from_dict(r.json())

    def list(self) -> List[ProcessInfo]:
        """The running processes, and the last ones that ended."""
        r = self._request("GET", c.process_url(self._session.id))
        return [ProcessInfo.from_dict(d) for d in r.json()]

    def output(self, pid: int, stdout_offset: int = 0, stderr_offset: int = 0, *,
               reconnects: int = RECONNECTS) -> Iterator[ProcessEvent]:
        """The process's output from these offsets (0: the oldest byte the server keeps), as
        it is written, ending with its ``exit`` event. A connection that breaks is opened
        again from the last offsets, up to ``reconnects`` times in a row."""
        client = self._session._client
        follow = c.ProcessFollower(stdout_offset, stderr_offset, reconnects)
        url = c.process_url(self._session.id, pid, "/output")
        while True:
            request = follow.request(client._http, url)
            response = client._send(request, stream=True)
            broke: Optional[httpx.TransportError] = None
            try:
                if response.status_code >= 400:
                    raise c.error_from(response, response.read())
                for line in response.iter_lines():
                    yield from follow.feed(line)
                    if follow.exited:
                        return
                yield from follow.feed(None)
                if follow.exited:
                    return
            except httpx.TransportError as e:
                broke = e
            finally:
                response.close()
            follow.broke(request, broke)

    def write_stdin(self, pid: int, data: c.FileData, eof: bool = False) -> None:
        """Writes ``data`` (str as UTF-8) to the process's stdin, then closes it if ``eof``.
        :class:`kennel.BadRequest` when it has no stdin open; :class:`kennel.Busy` while a MiB
        waits unread."""
        self._request("POST", c.process_url(self._session.id, pid, "/stdin"),
                      json=c.stdin_body(data, eof))

    def signal(self, pid: int, signal: int) -> None:
        """Sends ``signal`` (1 to 64, such as ``signal.SIGTERM``) to the process."""
        self._request("POST", c.process_url(self._session.id, pid, "/signal"),
                      json={"signal": int(signal)})

    def kill(self, pid: int) -> None:
        """Kills the process and what is left of its process group."""
        self._request("DELETE", c.process_url(self._session.id, pid))

    def attach(self, pid: int) -> Terminal:
        """The pty of a process started with ``tty=True``, as a :class:`Terminal` (its last
        64 KiB of output first)."""
        return attach_process(self._session, pid)

    def resize(self, pid: int, cols: int, rows: int) -> None:
        """Resizes a ``tty`` process's pty."""
        self._request("POST", c.process_url(self._session.id, pid, "/resize"),
                      json=c.size_body(cols, rows))


class Ports:
    """A session's preview URLs (``session.ports``): a port its code listens on, opened to a
    browser behind a signed token.

    >>> s.processes.start(cmd="python3 -m http.server 3000")
    >>> preview = s.ports.open(3000, expires_in="1h")
    >>> preview.url   # open it in a browser
    """

    def __init__(self, session: "Session"):
        self._session = session

    def open(self, port: int, expires_in: c.Timeout = None) -> PortInfo:
        """Opens ``port`` to previews for ``expires_in`` (seconds or "1h"; the server's
        ``ports.default_expiry`` when unset). Opening a port again gives a new token and
        revokes the old one. :class:`kennel.NotFound` for Kennel's own ports in the sandbox,
        :class:`kennel.Busy` past ``ports.max_per_session``, a :class:`kennel.KennelError` of
        status 503 where the session's tier or network gives no way to its ports (the message
        says why)."""
        r = self._session._client._request("POST", c.port_url(self._session.id),
                                           json=c.port_body(port, expires_in))
        return PortInfo.from_dict(r.json())

    def list(self) -> List[PortInfo]:
        """The session's open previews, by port."""
        r = self._session._client._request("GET", c.port_url(self._session.id))
        return [PortInfo.from_dict(d) for d in r.json()]

    def revoke(self, port: int) -> None:
        """Revokes the preview of ``port``: its token opens nothing from now on."""
        self._session._client._request("DELETE", c.port_url(self._session.id, port))


class Session(c.SessionFields):
    """A sandbox kept between an agent's steps (``POST /v1/sessions``).

    Python code runs in one persistent interpreter, so variables, imports and functions survive
    between :meth:`run_code` calls. Use it as a context manager (``with client.session() as
    s:``) or call :meth:`close` to end it. :attr:`isolation` is what its sandbox runs under;
    :attr:`ended` says why it died on its own, as of the last :meth:`refresh`.
    """

    def __init__(self, client: "Client", info: SessionInfo):
        self._client = client
        self.info = info
        self.id = info.id
        self.closed = False
        #: The session's background processes: :class:`Processes`.
        self.processes = Processes(self)
        #: The session's network, which :meth:`Network.update` changes: :class:`Network`.
        self.network = Network(self)
        #: The session's terminals: :class:`kennel.terminal.Terminals`.
        self.terminals = Terminals(self)
        #: The session's preview URLs: :class:`Ports`.
        self.ports = Ports(self)

    def __repr__(self) -> str:
        return f"<kennel.Session {self.id}{' closed' if self.closed else ''}>"

    def watch(self, path: str = "/workspace", recursive: bool = True) -> Watch:
        """Watches a directory under /workspace or /tmp (relative paths are under /workspace)
        and, with ``recursive``, the directories under it, those made later included: a
        :class:`Watch` of :class:`FileEvent` objects, in place once this returns.
        :class:`kennel.BadRequest` for a path outside them or not a directory,
        :class:`kennel.Busy` past the server's watches per session."""
        client = self._client
        request = client._http.build_request(
            "GET", c.session_url(self.id, "/watch"), params=c.watch_params(path, recursive),
            headers={"Accept": "text/event-stream"}, timeout=c.stream_timeout(client._http))
        return Watch(client, request)

    def pty(self, cols: int = c.DEFAULT_COLS, rows: int = c.DEFAULT_ROWS, *,
            cwd: Optional[str] = None, user: Optional[str] = None,
            env: Optional[Mapping[str, str]] = None) -> Terminal:
        """A new terminal (``bash --login``; see :class:`kennel.terminal.Terminals`),
        attached: a :class:`Terminal`. Leaving its ``with`` block detaches; ``kill()`` ends
        the shell."""
        info = self.terminals.create(cols, rows, cwd=cwd, user=user, env=env)
        try:
            return self.terminals.attach(info.pid)
        except BaseException:
            self.terminals.kill(info.pid)  # a shell nobody reached would hold a place
            raise

    def run_code(self, code: str, language: str = "python", *, timeout: c.Timeout = None,
                 stdin: Optional[str] = None,
                 figure_formats: Optional[Sequence[str]] = None,
                 user: Optional[str] = None) -> ExecResult:
        """Runs code (``python``, ``bash`` or ``sh``); ``timeout`` in seconds or as "30s";
        ``user="user"`` runs it as uid 1000 (HOME /workspace; python in an interpreter of its
        own), which some sandboxes refuse (:class:`kennel.BadRequest` says why)."""
        r = self._client._request("POST", c.session_url(self.id, "/exec"),
                                  json=c.exec_body(language, code, stdin, timeout, figure_formats, user))
        return ExecResult.from_dict(r.json())

    def run_command(self, cmd: Union[str, Sequence[str]], *, timeout: c.Timeout = None,
                    stdin: Optional[str] = None, user: Optional[str] = None) -> ExecResult:
        """Runs a shell command line with bash (an argv list is quoted into one)."""
        return self.run_code(_shell_line(cmd), "bash", timeout=timeout, stdin=stdin, user=user)

    def stream(self, code: str, language: str = "python", *, timeout: c.Timeout = None,
               stdin: Optional[str] = None,
               figure_formats: Optional[Sequence[str]] = None,
               user: Optional[str] = None) -> Stream[ExecResult]:
        """As :meth:`run_code`, streamed: a :class:`Stream` whose ``result`` is an
        :class:`ExecResult`."""
        return self._client._stream(c.session_url(self.id, "/exec"),
                                    c.exec_body(language, code, stdin, timeout, figure_formats, user),
                                    ExecResult.from_dict)

    def download_archive(self, path: str = "/workspace") -> bytes:
        """A directory of the sandbox (``/workspace``, ``/tmp`` or one under them) as an
        uncompressed tar archive."""
        return self._client._request("GET", c.session_url(self.id, "/archive"),
                                     params={"path": c.sandbox_dir(path)}).content

    def upload_archive(self, data: bytes, path: str = "/workspace") -> None:
        """Extracts a tar archive (plain, gzip, bzip2 or xz) under a directory of the sandbox.
        The server refuses the whole archive (:class:`BadRequest`) when a member would land
        outside that directory or is a hard link, a device or a FIFO."""
        self._client._request("PUT", c.session_url(self.id, "/archive"), content=bytes(data),
                              params={"path": c.sandbox_dir(path)},
                              headers={"Content-Type": "application/x-tar"})

    def upload_dir(self, local: str, path: str = "/workspace") -> None:
        """Copies a local directory's contents into the sandbox, as one archive."""
        self.upload_archive(c.tar_of_dir(local), path)

    def download_dir(self, path: str, local: str) -> None:
        """Copies a directory of the sandbox into a local one (made if missing); members that
        would land outside it are refused, as the server refuses them."""
        c.extract_tar(self.download_archive(path), local)

    def interrupt(self) -> None:
        """Sends SIGINT to the exec running in this session (from another thread), as Ctrl-C:
        python code gets a KeyboardInterrupt and the session keeps its state. Does nothing
        when no exec runs."""
        self._client._request("POST", c.session_url(self.id, "/interrupt"))

    def cancel(self) -> None:
        """Ends the exec running in this session (from another thread) as its timeout would:
        SIGINT, then a kill of code that does not stop within 2 s. Does nothing when none runs."""
        self._client._request("POST", c.session_url(self.id, "/cancel"))

    def write_file(self, path: str, data: c.FileData) -> None:
        """Writes a file (str is UTF-8 encoded) under /workspace or /tmp; relative paths are
        under /workspace."""
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._client._request("PUT", c.file_url(self.id, path), content=body,
                              headers={"Content-Type": "application/octet-stream"})

    def read_file(self, path: str) -> bytes:
        """A file's bytes (:class:`NotFound` when it does not exist)."""
        return self._client._request("GET", c.file_url(self.id, path)).content

    def delete_file(self, path: str) -> None:
        self._client._request("DELETE", c.file_url(self.id, path))

    def list_files(self, path: str = "/workspace") -> List[FileEntry]:
        """The entries of a directory under /workspace or /tmp."""
        r = self._client._request("GET", c.session_url(self.id, "/files"), params={"path": path})
        return [FileEntry.from_dict(e) for e in r.json().get("entries", [])]

    def pause(self, keep: Optional[str] = None) -> PauseInfo:
        """Pauses the session: its processes stop where they are and use no CPU. ``keep`` is
        ``"saved"`` (state to disk, survives a server restart; microvm and runsc) or
        ``"frozen"`` (memory resident); unset, ``saved`` where the tier can, else ``frozen``.
        The answer says how, and what was kept. Any later call resumes it, as :meth:`resume`
        does."""
        r = self._client._request("POST", c.session_url(self.id, "/pause"),
                                  json=c.pause_body(keep))
        return PauseInfo.from_dict(r.json())

    def resume(self) -> ResumeReport:
        """Resumes a paused session; the answer says what came back (:class:`kennel.Conflict`
        when it runs)."""
        r = self._client._request("POST", c.session_url(self.id, "/resume"))
        return ResumeReport.from_dict(r.json())

    def snapshot(self, ttl: c.Timeout = None) -> SnapshotInfo:
        """Snapshots the session, which runs on: its memory and files where the tier saves
        memory (microvm; runsc without a network), else its files in ``/workspace`` and
        ``/tmp`` only (``mechanism == "files"``). ``ttl`` (seconds or "1h") is how long the
        server keeps it (its ``snapshots.ttl`` when unset, at most ``snapshots.max_ttl``). It
        counts against the token's ``quota.disk`` until deleted
        (:meth:`Client.delete_snapshot`) or expired; past that, or the server's
        ``snapshots.max_per_token``, :class:`kennel.Busy`. :class:`kennel.Conflict` while the
        session is paused or busy."""
        r = self._client._request("POST", c.session_url(self.id, "/snapshot"),
                                  json=c.snapshot_body(ttl))
        return SnapshotInfo.from_dict(r.json())

    def fork(self, n: int, *, ttl: c.Timeout = None, keep_snapshot: bool = True,
             idle_ttl: c.Timeout = None, metadata: Optional[Mapping[str, str]] = None,
             on_idle: Optional[str] = None) -> List["Session"]:
        """``n`` copies of this session: it is snapshotted first (:meth:`snapshot`, with
        ``ttl``), then ``n`` sessions are made from that snapshot (:meth:`Client.fork`),
        each with fresh entropy, clock and Python/numpy random state. The snapshot is kept
        (and counts against ``quota.disk``) until its TTL, unless ``keep_snapshot=False``
        deletes it once the forks exist (they run on). Past the token's session quota no fork
        is made (:class:`kennel.Busy`)."""
        snap = self.snapshot(ttl)
        try:
            return self._client.fork(snap.id, n, idle_ttl=idle_ttl, metadata=metadata,
                                     on_idle=on_idle)
        finally:
            if not keep_snapshot:
                self._client.delete_snapshot(snap.id)

    def refresh(self) -> SessionInfo:
        """The session as the server sees it now (TTL left, limits)."""
        self.info = self._client.get_session(self.id)
        return self.info

    def close(self) -> None:
        """Ends the session (``DELETE``); closing an already ended session does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            self._client.delete_session(self.id)
        except NotFound:
            pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _shell_line(cmd: Union[str, Sequence[str]]) -> str:
    return cmd if isinstance(cmd, str) else " ".join(shlex.quote(a) for a in cmd)


class Client:
    """A client of a ``kennel serve`` HTTP API.

    ``base_url`` defaults to ``$KENNEL_URL`` or http://127.0.0.1:8080; ``token`` to
    ``$KENNEL_TOKEN`` (``token=""`` sends none, whatever the environment says); ``timeout`` is
    the HTTP timeout in seconds (it should exceed the runs' own time limits). ``http_client``
    replaces the ``httpx.Client`` (its own base URL, headers and transport are then used).

    A 429, or a 503 with ``Retry-After``, is sent again up to ``retries`` times, after the
    answer's ``Retry-After`` (else 0.5 s, doubling), when that is at most ``max_retry_wait``
    seconds; then its error (:class:`kennel.Busy` for a 429) is raised. A server that cannot
    be reached raises :class:`kennel.ConnectionFailed`, naming the URL.
    """

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None,
                 timeout: Optional[float] = c.DEFAULT_TIMEOUT, *,
                 http_client: Optional[httpx.Client] = None,
                 retries: int = c.DEFAULT_RETRIES,
                 max_retry_wait: float = c.DEFAULT_MAX_RETRY_WAIT):
        import os

        self.base_url = (base_url or os.environ.get("KENNEL_URL") or DEFAULT_URL).rstrip("/")
        self._http = http_client or httpx.Client(
            base_url=self.base_url, headers=c.headers_for(c.token_from(token)), timeout=timeout)
        self._retry = c.Retry(retries, max_retry_wait)

    def __repr__(self) -> str:
        return f"<kennel.Client {self.base_url}>"

    # -- plumbing -------------------------------------------------------------------------

    def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """Sends ``request``, again while the answer says "later" (:class:`c.Retry`); a
        request that gets no answer raises a :class:`kennel.TransportError`."""
        attempt = 0
        while True:
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as e:
                raise c.transport_error(request, e) from e
            wait = self._retry.delay(response, attempt)
            if wait is None:
                return response
            response.close()
            time.sleep(wait)
            attempt += 1

    def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        return c.check(self._send(self._http.build_request(method, url, **kw)))

    def _stream(self, url: str, body: Dict[str, Any],
                parse: Callable[[Dict[str, Any]], R]) -> Stream[R]:
        request = self._http.build_request("POST", url, json=body, params={"stream": "true"},
                                           headers={"Accept": "text/event-stream"})
        response = self._send(request, stream=True)
        if response.status_code >= 400:
            try:
                body_bytes = response.read()
            except httpx.TransportError as e:
                raise c.transport_error(request, e) from e
            finally:
                response.close()
            raise c.error_from(response, body_bytes)
        return Stream(response, parse)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- one-shot runs --------------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """``GET /healthz``."""
        return self._request("GET", "/healthz").json()

    def run(self, spec: Mapping[str, Any]) -> RunResult:
        """A raw ``RunSpec`` dict, as the API takes it."""
        return RunResult.from_dict(self._request("POST", "/v1/runs", json=dict(spec)).json())

    def submit(self, spec: Mapping[str, Any], *, callback_url: Optional[str] = None) -> RunInfo:
        """An ``async`` run: a raw ``RunSpec`` dict, answered at once with its id (status
        ``running``); :meth:`get_run` follows it. ``callback_url`` has its end POSTed there,
        signed (:func:`kennel.verify_webhook` checks it)."""
        body = dict(spec, **{"async": True})
        if callback_url is not None:
            body["callback_url"] = callback_url
        return RunInfo.from_dict(self._request("POST", "/v1/runs", json=body).json())

    def get_run(self, run_id: str) -> RunInfo:
        """``GET /v1/runs/{id}``: a run's status, and its result once it has ended."""
        return RunInfo.from_dict(self._request("GET", f"/v1/runs/{run_id}").json())

    def cancel_run(self, run_id: str) -> None:
        """``DELETE /v1/runs/{id}``: kills the run's sandbox; its result says ``cancelled``."""
        self._request("DELETE", f"/v1/runs/{run_id}")

    def wait_run(self, run_id: str, timeout: float = 300, poll: float = 0.2) -> RunInfo:
        """Polls :meth:`get_run` until the run has ended (``TimeoutError`` past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.get_run(run_id)
            if info.done:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still running after {timeout} s")
            time.sleep(poll)

    def run_code(self, code: str, language: str = "python", *, stdin: Optional[str] = None,
                 files: Optional[Mapping[str, c.FileData]] = None,
                 collect: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None,
                 limits: Optional[Mapping[str, Any]] = None, network: Any = None, image: Optional[str] = None,
                 tier: Optional[str] = None, runtime: Optional[str] = None,
                 platform: Optional[str] = None, rich: bool = False,
                 on_violation: Optional[str] = None, volumes: Any = None) -> RunResult:
        """Runs a snippet in a fresh sandbox.

        ``files`` maps sandbox paths (under /workspace or /tmp) to str or bytes; ``collect``
        lists paths whose contents come back in ``result.files`` (``.data`` is bytes);
        ``limits`` is a dict such as ``{"timeout": "5s", "memory": "256M"}`` (a number for
        ``timeout`` is seconds); ``network`` a dict (``{"mode": "allow", "allow": [...]}``), a
        mode string, or a list of domains to allow. ``tier`` is the isolation: ``"native"``
        (the server's default), ``"oci"`` or ``"microvm"`` (a guest kernel of its own, the
        strongest); ``runtime`` the oci tier's runtime (``"runsc"``, ``"crun"``, ``"runc"``,
        ``"docker"``), which implies ``tier="oci"``; ``platform`` gVisor's (``"ptrace"`` or
        ``"kvm"``; the server chooses when unset). ``result.isolation`` says what was in
        force. With ``rich=True`` (python) the result has rich results as a session exec's:
        ``results`` (``result.value``, figures), ``error`` as data.
        """
        return self.run(c.run_body(language=language, code=code, stdin=stdin, files=files,
                                   collect=collect, env=env, limits=limits, network=network, image=image,
                                   tier=tier, runtime=runtime, platform=platform, rich=rich,
                                   on_violation=on_violation, volumes=volumes))

    def run_command(self, argv: Sequence[str], *, stdin: Optional[str] = None,
                    files: Optional[Mapping[str, c.FileData]] = None,
                    collect: Optional[Sequence[str]] = None,
                    env: Optional[Mapping[str, str]] = None,
                    limits: Optional[Mapping[str, Any]] = None, network: Any = None, image: Optional[str] = None,
                    tier: Optional[str] = None, runtime: Optional[str] = None,
                    platform: Optional[str] = None,
                    on_violation: Optional[str] = None, volumes: Any = None) -> RunResult:
        """Runs an argv (no shell) in a fresh sandbox; options as for :meth:`run_code`."""
        return self.run(c.run_body(argv=list(argv), stdin=stdin, files=files, collect=collect,
                                   env=env, limits=limits, network=network, image=image,
                                   tier=tier, runtime=runtime, platform=platform,
                                   on_violation=on_violation, volumes=volumes))

    def stream_code(self, code: str, language: str = "python", *, stdin: Optional[str] = None,
                    files: Optional[Mapping[str, c.FileData]] = None,
                    collect: Optional[Sequence[str]] = None,
                    env: Optional[Mapping[str, str]] = None,
                    limits: Optional[Mapping[str, Any]] = None,
                    network: Any = None, image: Optional[str] = None,
                    tier: Optional[str] = None, runtime: Optional[str] = None,
                    platform: Optional[str] = None, rich: bool = False,
                    on_violation: Optional[str] = None) -> Stream[RunResult]:
        """As :meth:`run_code`, streamed: iterate the returned :class:`Stream` for output
        chunks, then read ``stream.result`` (a :class:`RunResult`). A request the server
        refuses raises here, before any iteration."""
        body = c.run_body(language=language, code=code, stdin=stdin, files=files,
                          collect=collect, env=env, limits=limits, network=network, image=image,
                          tier=tier, runtime=runtime, platform=platform, rich=rich,
                          on_violation=on_violation)
        return self._stream("/v1/runs", body, RunResult.from_dict)

    def stream_command(self, argv: Sequence[str], **opts: Any) -> Stream[RunResult]:
        """As :meth:`run_command`, streamed (see :meth:`stream_code`)."""
        return self._stream("/v1/runs", c.run_body(argv=list(argv), **opts), RunResult.from_dict)

    # -- sessions -------------------------------------------------------------------------

    def session(self, *, limits: Optional[Mapping[str, Any]] = None,
                env: Optional[Mapping[str, str]] = None, network: Any = None,
                idle_ttl: c.Timeout = None, tier: Optional[str] = None,
                runtime: Optional[str] = None, platform: Optional[str] = None,
                image: Optional[str] = None, name: Optional[str] = None,
                metadata: Optional[Mapping[str, str]] = None,
                get_or_create: bool = False, on_idle: Optional[str] = None,
                from_snapshot: Optional[str] = None,
                volumes: Any = None) -> Session:
        """Creates a session; use the result as a context manager to end it on exit.

        ``limits`` (``timeout`` is each exec's default), ``env`` and ``network`` are as for
        :meth:`run_code`; ``idle_ttl`` ends the session after that long unused. ``tier``,
        ``runtime``, ``platform`` and ``image`` place its sandbox as they place a run's:
        ``client.session(runtime="runsc")`` keeps one gVisor sandbox for the whole task,
        ``client.session(tier="microvm")`` a guest kernel of its own. ``session.isolation``
        says what is in force.

        ``name`` (1 to 63 of a-z, 0-9, ``.``, ``_``, ``-``) is unique among this token's open
        sessions: a taken one raises :class:`kennel.Conflict`, unless ``get_or_create``, which
        then answers that session when its spec matches (:class:`kennel.Conflict` naming the
        fields otherwise). ``metadata``: at most 16 labels, which :meth:`list_sessions`
        filters by. ``on_idle="pause"`` pauses the session when its idle TTL runs out (the
        next call resumes it) instead of ending it.

        ``from_snapshot`` (a :meth:`Session.snapshot`'s id) makes the session from that
        snapshot: its files, and its memory where the snapshot holds it, checked before
        anything runs (:class:`kennel.Conflict` for a snapshot altered since). It has the
        snapshot's tier, image, limits, network and env, so those stay unset.
        """
        body = c.session_body(limits=limits, env=env, network=network, idle_ttl=idle_ttl,
                              tier=tier, runtime=runtime, platform=platform, image=image,
                              name=name, metadata=metadata, get_or_create=get_or_create,
                              on_idle=on_idle, from_snapshot=from_snapshot,
                              volumes=volumes)
        info = SessionInfo.from_dict(self._request("POST", "/v1/sessions", json=body).json())
        return Session(self, info)

    create_session = session

    def get_or_create(self, name: str, **options: Any) -> Session:
        """This token's open session called ``name`` if there is one whose spec matches
        ``options`` (:meth:`session`'s), else a new one of that name. Its ``with`` block ends
        it on exit, as :meth:`session`'s does."""
        return self.session(name=name, get_or_create=True, **options)

    def list_sessions(self, *, name: Optional[str] = None,
                      metadata: Optional[Mapping[str, str]] = None) -> List[SessionInfo]:
        """This token's sessions, oldest first: only the one called ``name`` and those with
        all of ``metadata``'s pairs, when given."""
        params = c.sessions_params(name, metadata)
        r = self._request("GET", "/v1/sessions", params=params)
        return [SessionInfo.from_dict(d) for d in r.json()]

    sessions = list_sessions

    def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_dict(self._request("GET", c.session_url(session_id)).json())

    def attach(self, session_id: str) -> Session:
        """A :class:`Session` handle for an existing session id."""
        return Session(self, self.get_session(session_id))

    def delete_session(self, session_id: str) -> None:
        self._request("DELETE", c.session_url(session_id))

    # -- snapshots and forks --------------------------------------------------------------

    def fork(self, snapshot_id: str, n: int, *, idle_ttl: c.Timeout = None,
             metadata: Optional[Mapping[str, str]] = None,
             on_idle: Optional[str] = None) -> List[Session]:
        """``n`` sessions (1 to 64) made from one snapshot at once, each with fresh entropy,
        clock and Python/numpy random state: all of them, or none when the token's session
        quota (or the server) has no room for them all (:class:`kennel.Busy`, 429). End each
        (``close()``) when done."""
        body = c.fork_body(snapshot_id, n, idle_ttl=idle_ttl, metadata=metadata,
                           on_idle=on_idle)
        r = self._request("POST", "/v1/sessions", json=body)
        return [Session(self, info) for info in c.forked(r.json())]

    def list_snapshots(self) -> List[SnapshotInfo]:
        """This token's snapshots, oldest first."""
        return [SnapshotInfo.from_dict(d) for d in self._request("GET", c.snapshot_url()).json()]

    snapshots = list_snapshots

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """One of this token's snapshots (:class:`kennel.NotFound` for another's)."""
        return SnapshotInfo.from_dict(self._request("GET", c.snapshot_url(snapshot_id)).json())

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot and its state; sessions made from it run on."""
        self._request("DELETE", c.snapshot_url(snapshot_id))

    # -- volumes --------------------------------------------------------------------------

    def create_volume(self, name: str, size: Any, *, for_: Optional[str] = None) -> VolumeInfo:
        """``POST /v1/volumes``: an ext4 volume of ``size`` ("64M", or bytes) that outlives
        sandboxes; ``for_="microvm"`` makes one for microVMs only (the default, ``host``, is
        for native and oci sandboxes). Mount it with ``volumes=[(name, "/workspace/data")]``
        on a run or a session; one read-write at a time, or read-only by any number."""
        r = self._request("POST", "/v1/volumes", json=c.volume_body(name, size, for_))
        return VolumeInfo.from_dict(r.json())

    def list_volumes(self) -> List[VolumeInfo]:
        """This token's volumes, by name, with who has each mounted."""
        r = self._request("GET", "/v1/volumes")
        return [VolumeInfo.from_dict(d) for d in r.json()]

    def get_volume(self, name: str) -> VolumeInfo:
        return VolumeInfo.from_dict((self._request("GET", c.volume_url(name))).json())

    def delete_volume(self, name: str) -> None:
        """Deletes a volume and its data (:class:`kennel.Conflict` while one has it mounted)."""
        self._request("DELETE", c.volume_url(name))
