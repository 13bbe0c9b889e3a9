"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSession` and :class:`AsyncStream`.

They mirror the synchronous ones; every method that talks to the server is a coroutine::

    async with kennel.AsyncClient(url) as client:
        result = await client.run_code("print(6*7)")
        async with client.session() as s:
            await s.run_code("x = 41")
            print((await s.run_code("print(x + 1)")).stdout)
        stream = await client.stream_code("print('hi')")
        async for chunk in stream:
            print(chunk.text, end="")
        print(stream.result.exit_code)
"""

from __future__ import annotations

import asyncio
import os
from typing import (Any, AsyncIterator, Callable, Dict, Generic, List, Mapping, Optional,
                    Sequence, TypeVar)

import httpx

from . import _common as c
from .client import DEFAULT_URL, RECONNECTS, _shell_line
from .errors import KennelError, NotFound
from .results import (ExecResult, FileEntry, FileEvent, OutputChunk, PauseInfo, ProcessEvent,
                      PortInfo, ProcessInfo, ResumeReport, RunInfo, RunResult, SessionInfo,
                      SnapshotInfo, VolumeInfo)
from .terminal import AsyncTerminal, AsyncTerminals

R = TypeVar("R")


class AsyncStream(Generic[R]):
    """A streamed run or exec: ``async for chunk in stream`` yields :class:`OutputChunk`
    objects (and, for a python session exec, :class:`RichOutput` ones as they are shown);
    after the loop, :attr:`result` is the final :class:`RunResult` or :class:`ExecResult`. ``await stream.wait()`` reads whatever is left and returns it. An
    ``error`` event raises :class:`KennelError`. ``async with`` (or ``await stream.aclose()``)
    frees the connection when stopping early."""

    def __init__(self, response: httpx.Response, parse: Callable[[Dict[str, Any]], R]):
        self._response = response
        self._parse = parse
        self._result: Optional[R] = None
        self._error: Optional[KennelError] = None
        self._done = False
        self._outcome = c.Outcome()
        self._iter = self._events()

    async def _events(self) -> AsyncIterator[c.Piece]:
        parser = c.SSEParser()
        try:
            async for line in self._lines():
                for piece in line.splitlines() or [""]:
                    ev = parser.feed(piece)
                    if ev is not None:
                        chunk = self._handle(*ev)
                        if chunk is not None:
                            yield chunk
                    if self._done:
                        return
            ev = parser.finish()
            if ev is not None:
                chunk = self._handle(*ev)
                if chunk is not None:
                    yield chunk
        finally:
            await self._response.aclose()
            if not self._done:
                self._done = True
                if self._error is None and self._result is None:
                    self._error = KennelError(None, "stream_ended",
                                              "the stream ended without a result")

    async def _lines(self) -> AsyncIterator[str]:
        """The stream's lines; a connection that breaks is a :class:`kennel.TransportError`."""
        try:
            async for line in self._response.aiter_lines():
                yield line
        except httpx.TransportError as e:
            self._error = c.transport_error(self._response.request, e)
            self._done = True
            raise self._error from e

    def _handle(self, event: str, data: str) -> Optional[c.Piece]:
        try:
            chunk, result = self._outcome.collect(event, data)
        except KennelError as e:
            self._error, self._done = e, True
            raise
        if result is not None:
            self._result, self._done = self._parse(result), True
        return chunk

    def __aiter__(self) -> AsyncIterator[c.Piece]:
        return self

    async def __anext__(self) -> c.Piece:
        return await self._iter.__anext__()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def result(self) -> R:
        """The final result; only once the stream has been read to its end (else
        ``RuntimeError``: use ``await stream.wait()``)."""
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the stream is not finished: iterate it or `await stream.wait()`")
        return self._result

    async def wait(self) -> R:
        """Reads the rest of the stream and returns the final result."""
        async for _ in self._iter:
            pass
        return self.result

    async def aclose(self) -> None:
        await self._iter.aclose()
        await self._response.aclose()

    async def __aenter__(self) -> "AsyncStream[R]":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncWatch:
    """The asyncio twin of :class:`kennel.client.Watch`: ``async for ev in watch`` yields
    :class:`FileEvent` objects; ``await watch.aclose()`` (or leaving ``async with``) ends
    it."""

    def __init__(self, request: httpx.Request, response: httpx.Response):
        self._request = request
        self._response = response
        self._reader = c.WatchReader()
        self._queue: List[FileEvent] = []
        self._lines = response.aiter_lines()

    @classmethod
    async def open(cls, client: "AsyncClient", request: httpx.Request) -> "AsyncWatch":
        """The watch, once the server says it is in place."""
        response = await client._send(request, stream=True)
        watch = cls(request, response)
        try:
            if response.status_code >= 400:
                raise c.error_from(response, await response.aread())
            while not watch._reader.ready:
                watch._queue += watch._reader.feed(await watch._next_line())
        except BaseException:
            await response.aclose()
            raise
        return watch

    @property
    def path(self) -> Optional[str]:
        return self._reader.path

    async def _next_line(self) -> Optional[str]:
        try:
            return await self._lines.__anext__()
        except StopAsyncIteration:
            return None
        except httpx.TransportError as e:
            raise c.transport_error(self._request, e) from e

    def __aiter__(self) -> AsyncIterator[FileEvent]:
        return self

    async def __anext__(self) -> FileEvent:
        while not self._queue:
            line = await self._next_line()
            self._queue += self._reader.feed(line)
            if line is None and not self._queue:
                await self.aclose()
                raise StopAsyncIteration
        return self._queue.pop(0)

    async def aclose(self) -> None:
        await self._response.aclose()

    close = aclose

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncNetwork:
    """A session's network (``session.network``), as :class:`kennel.client.Network`."""

    def __init__(self, session: "AsyncSession"):
        self._session = session

    async def update(self, network: Any = None, *,
                     resolve: Optional[Sequence[str]] = None) -> SessionInfo:
        """Replaces the session's network, as :meth:`kennel.client.Network.update`."""
        r = await self._session._client._request(
            "PATCH", c.session_url(self._session.id, "/network"),
            json=c.network_update_body(network, resolve))
        self._session.info = SessionInfo.from_dict(r.json())
        return self._session.info


class AsyncProcesses:
    """The asyncio twin of :class:`kennel.client.Processes` (``session.processes``);
    :meth:`output` is an async iterator."""

    def __init__(self, session: "AsyncSession"):
        self._session = session

    async def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        return await self._session._client._request(method, url, **kw)

    async def start(self, argv: Optional[Sequence[str]] = None, cmd: Optional[str] = None, *,
                    cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                    stdin: bool = False, timeout: c.Timeout = None,
                    user: Optional[str] = None, tty: bool = False,
                    cols: Optional[int] = None, rows: Optional[int] = None) -> ProcessInfo:
        body = c.process_body(argv, cmd, cwd, env, stdin, timeout, user, tty, cols, rows)
        r = await self._request("POST", c.process_url(self._session.id), json=body)
        return ProcessInfo.from_dict(r.json())

    async def list(self) -> List[ProcessInfo]:
        r = await self._request("GET", c.process_url(self._session.id))
        return [ProcessInfo.from_dict(d) for d in r.json()]

    async def output(self, pid: int, stdout_offset: int = 0, stderr_offset: int = 0, *,
                     reconnects: int = RECONNECTS) -> AsyncIterator[ProcessEvent]:
        """As :meth:`kennel.client.Processes.output`: ``async for ev in ...``."""
        client = self._session._client
        follow = c.ProcessFollower(stdout_offset, stderr_offset, reconnects)
        url = c.process_url(self._session.id, pid, "/output")
        while True:
            request = follow.request(client._http, url)
            response = await client._send(request, stream=True)
            broke: Optional[httpx.TransportError] = None
            try:
                if response.status_code >= 400:
                    raise c.error_from(response, await response.aread())
                async for line in response.aiter_lines():
                    for ev in follow.feed(line):
                        yield ev
                    if follow.exited:
                        return
                for ev in follow.feed(None):
                    yield ev
                if follow.exited:
                    return
            except httpx.TransportError as e:
                broke = e
            finally:
                await response.aclose()
            follow.broke(request, broke)

    async def write_stdin(self, pid: int, data: c.FileData, eof: bool = False) -> None:
        await self._request("POST", c.process_url(self._session.id, pid, "/stdin"),
                            json=c.stdin_body(data, eof))

    async def signal(self, pid: int, signal: int) -> None:
        await self._request("POST", c.process_url(self._session.id, pid, "/signal"),
                            json={"signal": int(signal)})

    async def kill(self, pid: int) -> None:
        await self._request("DELETE", c.process_url(self._session.id, pid))

    def attach(self, pid: int) -> c.Opening[AsyncTerminal]:
        """The pty of a process started with ``tty=True``: ``await`` it, or ``async with``
        it to detach on exit."""
        url = c.process_url(self._session.id, pid)
        return c.Opening(lambda: AsyncTerminal.open(self._session._client, url, url + "/pty",
                                                    pid))

    async def resize(self, pid: int, cols: int, rows: int) -> None:
        await self._request("POST", c.process_url(self._session.id, pid, "/resize"),
                            json=c.size_body(cols, rows))


class AsyncPorts:
    """The asyncio twin of :class:`kennel.client.Ports` (``session.ports``)."""

    def __init__(self, session: "AsyncSession"):
        self._session = session

    async def open(self, port: int, expires_in: c.Timeout = None) -> PortInfo:
        r = await self._session._client._request("POST", c.port_url(self._session.id),
                                                 json=c.port_body(port, expires_in))
        return PortInfo.from_dict(r.json())

    async def list(self) -> List[PortInfo]:
        r = await self._session._client._request("GET", c.port_url(self._session.id))
        return [PortInfo.from_dict(d) for d in r.json()]

    async def revoke(self, port: int) -> None:
        await self._session._client._request("DELETE", c.port_url(self._session.id, port))


class AsyncSession(c.SessionFields):
    """The asyncio twin of :class:`kennel.Session`, with its :attr:`isolation` and
    :attr:`ended`."""

    def __init__(self, client: "AsyncClient", info: SessionInfo):
        self._client = client
        self.info = info
        self.id = info.id
        self.closed = False
        #: The session's background processes: :class:`AsyncProcesses`.
        self.processes = AsyncProcesses(self)
        #: The session's network, which :meth:`AsyncNetwork.update` changes.
        self.network = AsyncNetwork(self)
        #: The session's terminals: :class:`kennel.terminal.AsyncTerminals`.
        self.terminals = AsyncTerminals(self)
        #: The session's preview URLs: :class:`AsyncPorts`.
        self.ports = AsyncPorts(self)

    def __repr__(self) -> str:
        return f"<kennel.AsyncSession {self.id}{' closed' if self.closed else ''}>"

    def watch(self, path: str = "/workspace", recursive: bool = True) -> c.Opening[AsyncWatch]:
        """As :meth:`kennel.Session.watch`: ``async with s.watch() as w:`` (ended on exit) or
        ``w = await s.watch()``; in place once it is open."""
        http = self._client._http
        request = http.build_request(
            "GET", c.session_url(self.id, "/watch"), params=c.watch_params(path, recursive),
            headers={"Accept": "text/event-stream"}, timeout=c.stream_timeout(http))
        return c.Opening(lambda: AsyncWatch.open(self._client, request))

    def pty(self, cols: int = c.DEFAULT_COLS, rows: int = c.DEFAULT_ROWS, *,
            cwd: Optional[str] = None, user: Optional[str] = None,
            env: Optional[Mapping[str, str]] = None) -> c.Opening[AsyncTerminal]:
        """As :meth:`kennel.Session.pty`: ``async with s.pty() as term:`` (detached on exit)
        or ``term = await s.pty()``."""

        async def create() -> AsyncTerminal:
            info = await self.terminals.create(cols, rows, cwd=cwd, user=user, env=env)
            try:
                return await self.terminals.attach(info.pid)
            except BaseException:
                await self.terminals.kill(info.pid)  # a shell nobody reached holds a place
                raise

        return c.Opening(create)

    async def run_code(self, code: str, language: str = "python", *, timeout: c.Timeout = None,
                       stdin: Optional[str] = None,
                       figure_formats: Optional[Sequence[str]] = None,
                       user: Optional[str] = None) -> ExecResult:
        r = await self._client._request("POST", c.session_url(self.id, "/exec"),
                                        json=c.exec_body(language, code, stdin, timeout, figure_formats, user))
        return ExecResult.from_dict(r.json())

    async def run_command(self, cmd: Any, *, timeout: c.Timeout = None,
                          stdin: Optional[str] = None, user: Optional[str] = None) -> ExecResult:
        return await self.run_code(_shell_line(cmd), "bash", timeout=timeout, stdin=stdin, user=user)

    async def stream(self, code: str, language: str = "python", *, timeout: c.Timeout = None,
                     stdin: Optional[str] = None,
                     figure_formats: Optional[Sequence[str]] = None,
                     user: Optional[str] = None) -> AsyncStream[ExecResult]:
        return await self._client._stream(c.session_url(self.id, "/exec"),
                                          c.exec_body(language, code, stdin, timeout, figure_formats, user),
                                          ExecResult.from_dict)

    async def download_archive(self, path: str = "/workspace") -> bytes:
        r = await self._client._request("GET", c.session_url(self.id, "/archive"),
                                        params={"path": c.sandbox_dir(path)})
        return r.content

    async def upload_archive(self, data: bytes, path: str = "/workspace") -> None:
        await self._client._request("PUT", c.session_url(self.id, "/archive"), content=bytes(data),
                                    params={"path": c.sandbox_dir(path)},
                                    headers={"Content-Type": "application/x-tar"})

    async def upload_dir(self, local: str, path: str = "/workspace") -> None:
        await self.upload_archive(c.tar_of_dir(local), path)

    async def download_dir(self, path: str, local: str) -> None:
        c.extract_tar(await self.download_archive(path), local)

    async def interrupt(self) -> None:
        """SIGINT to the exec running in this session, as :meth:`Session.interrupt`."""
        await self._client._request("POST", c.session_url(self.id, "/interrupt"))

    async def cancel(self) -> None:
        """Ends the running exec, as :meth:`Session.cancel`."""
        await self._client._request("POST", c.session_url(self.id, "/cancel"))

    async def write_file(self, path: str, data: c.FileData) -> None:
        body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        await self._client._request("PUT", c.file_url(self.id, path), content=body,
                                    headers={"Content-Type": "application/octet-stream"})

    async def read_file(self, path: str) -> bytes:
        return (await self._client._request("GET", c.file_url(self.id, path))).content

    async def delete_file(self, path: str) -> None:
        await self._client._request("DELETE", c.file_url(self.id, path))

    async def list_files(self, path: str = "/workspace") -> List[FileEntry]:
        r = await self._client._request("GET", c.session_url(self.id, "/files"),
                                        params={"path": path})
        return [FileEntry.from_dict(e) for e in r.json().get("entries", [])]

    async def pause(self, keep: Optional[str] = None) -> PauseInfo:
        """Pauses the session, as :meth:`Session.pause`."""
        r = await self._client._request("POST", c.session_url(self.id, "/pause"),
                                        json=c.pause_body(keep))
        return PauseInfo.from_dict(r.json())

    async def resume(self) -> ResumeReport:
        """Resumes a paused session, as :meth:`Session.resume`."""
        r = await self._client._request("POST", c.session_url(self.id, "/resume"))
        return ResumeReport.from_dict(r.json())

    async def snapshot(self, ttl: c.Timeout = None) -> SnapshotInfo:
        """Snapshots the session, which runs on, as :meth:`kennel.Session.snapshot`."""
        r = await self._client._request("POST", c.session_url(self.id, "/snapshot"),
                                        json=c.snapshot_body(ttl))
        return SnapshotInfo.from_dict(r.json())

    async def fork(self, n: int, *, ttl: c.Timeout = None, keep_snapshot: bool = True,
                   idle_ttl: c.Timeout = None, metadata: Optional[Mapping[str, str]] = None,
                   on_idle: Optional[str] = None) -> List["AsyncSession"]:
        """``n`` copies of this session, as :meth:`kennel.Session.fork`: it is snapshotted
        first, then ``n`` sessions are made from the snapshot (kept until its TTL unless
        ``keep_snapshot=False``)."""
        snap = await self.snapshot(ttl)
        try:
            return await self._client.fork(snap.id, n, idle_ttl=idle_ttl, metadata=metadata,
                                           on_idle=on_idle)
        finally:
            if not keep_snapshot:
                await self._client.delete_snapshot(snap.id)

    async def refresh(self) -> SessionInfo:
        self.info = await self._client.get_session(self.id)
        return self.info

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._client.delete_session(self.id)
        except NotFound:
            pass

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncClient:
    """The asyncio twin of :class:`kennel.Client` (same arguments, the same retries and
    errors)."""

    def __init__(self, base_url: Optional[str] = None, token: Optional[str] = None,
                 timeout: Optional[float] = c.DEFAULT_TIMEOUT, *,
                 http_client: Optional[httpx.AsyncClient] = None,
                 retries: int = c.DEFAULT_RETRIES,
                 max_retry_wait: float = c.DEFAULT_MAX_RETRY_WAIT):
        self.base_url = (base_url or os.environ.get("KENNEL_URL") or DEFAULT_URL).rstrip("/")
        self._http = http_client or httpx.AsyncClient(
            base_url=self.base_url, headers=c.headers_for(c.token_from(token)), timeout=timeout)
        self._retry = c.Retry(retries, max_retry_wait)

    def __repr__(self) -> str:
        return f"<kennel.AsyncClient {self.base_url}>"

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """Sends ``request``, again while the answer says "later" (:class:`c.Retry`); a
        request that gets no answer raises a :class:`kennel.TransportError`."""
        attempt = 0
        while True:
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as e:
                raise c.transport_error(request, e) from e
            wait = self._retry.delay(response, attempt)
            if wait is None:
                return response
            await response.aclose()
            await asyncio.sleep(wait)
            attempt += 1

    async def _request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        return c.check(await self._send(self._http.build_request(method, url, **kw)))

    async def _stream(self, url: str, body: Dict[str, Any],
                      parse: Callable[[Dict[str, Any]], R]) -> AsyncStream[R]:
        request = self._http.build_request("POST", url, json=body, params={"stream": "true"},
                                           headers={"Accept": "text/event-stream"})
        response = await self._send(request, stream=True)
        if response.status_code >= 400:
            try:
                body_bytes = await response.aread()
            except httpx.TransportError as e:
                raise c.transport_error(request, e) from e
            finally:
                await response.aclose()
            raise c.error_from(response, body_bytes)
        return AsyncStream(response, parse)

    async def aclose(self) -> None:
        await self._http.aclose()

    close = aclose

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def health(self) -> Dict[str, Any]:
        return (await self._request("GET", "/healthz")).json()

    async def run(self, spec: Mapping[str, Any]) -> RunResult:
        r = await self._request("POST", "/v1/runs", json=dict(spec))
        return RunResult.from_dict(r.json())

    async def submit(self, spec: Mapping[str, Any], *,
                     callback_url: Optional[str] = None) -> RunInfo:
        """As :meth:`Client.submit`."""
        body = dict(spec, **{"async": True})
        if callback_url is not None:
            body["callback_url"] = callback_url
        return RunInfo.from_dict((await self._request("POST", "/v1/runs", json=body)).json())

    async def get_run(self, run_id: str) -> RunInfo:
        """As :meth:`Client.get_run`."""
        return RunInfo.from_dict((await self._request("GET", f"/v1/runs/{run_id}")).json())

    async def cancel_run(self, run_id: str) -> None:
        """As :meth:`Client.cancel_run`."""
        await self._request("DELETE", f"/v1/runs/{run_id}")

    async def run_code(self, code: str, language: str = "python", *,
                       stdin: Optional[str] = None,
                       files: Optional[Mapping[str, c.FileData]] = None,
                       collect: Optional[Sequence[str]] = None,
                       env: Optional[Mapping[str, str]] = None,
                       limits: Optional[Mapping[str, Any]] = None,
                       network: Any = None, image: Optional[str] = None,
                       tier: Optional[str] = None, runtime: Optional[str] = None,
                       platform: Optional[str] = None, rich: bool = False,
                       on_violation: Optional[str] = None, volumes: Any = None) -> RunResult:
        return await self.run(c.run_body(language=language, code=code, stdin=stdin, files=files,
                                         collect=collect, env=env, limits=limits,
                                         network=network, image=image, tier=tier,
                                         runtime=runtime, platform=platform, rich=rich,
                                         on_violation=on_violation, volumes=volumes))

    async def run_command(self, argv: Sequence[str], *, stdin: Optional[str] = None,
                          files: Optional[Mapping[str, c.FileData]] = None,
                          collect: Optional[Sequence[str]] = None,
                          env: Optional[Mapping[str, str]] = None,
                          limits: Optional[Mapping[str, Any]] = None,
                          network: Any = None, image: Optional[str] = None,
                          tier: Optional[str] = None, runtime: Optional[str] = None,
                          platform: Optional[str] = None,
                          on_violation: Optional[str] = None, volumes: Any = None) -> RunResult:
        return await self.run(c.run_body(argv=list(argv), stdin=stdin, files=files,
                                         collect=collect, env=env, limits=limits,
                                         network=network, image=image, tier=tier,
                                         runtime=runtime, platform=platform,
                                         on_violation=on_violation, volumes=volumes))

    async def stream_code(self, code: str, language: str = "python", *,
                          stdin: Optional[str] = None,
                          files: Optional[Mapping[str, c.FileData]] = None,
                          collect: Optional[Sequence[str]] = None,
                          env: Optional[Mapping[str, str]] = None,
                          limits: Optional[Mapping[str, Any]] = None,
                          network: Any = None, image: Optional[str] = None,
                          tier: Optional[str] = None,
                          runtime: Optional[str] = None,
                          platform: Optional[str] = None, rich: bool = False,
                          on_violation: Optional[str] = None) -> AsyncStream[RunResult]:
        body = c.run_body(language=language, code=code, stdin=stdin, files=files,
                          collect=collect, env=env, limits=limits, network=network, image=image,
                          tier=tier, runtime=runtime, platform=platform, rich=rich,
                          on_violation=on_violation)
        return await self._stream("/v1/runs", body, RunResult.from_dict)

    async def stream_command(self, argv: Sequence[str], **opts: Any) -> AsyncStream[RunResult]:
        return await self._stream("/v1/runs", c.run_body(argv=list(argv), **opts),
                                  RunResult.from_dict)

    def session(self, *, limits: Optional[Mapping[str, Any]] = None,
                env: Optional[Mapping[str, str]] = None, network: Any = None,
                idle_ttl: c.Timeout = None, tier: Optional[str] = None,
                runtime: Optional[str] = None, platform: Optional[str] = None,
                image: Optional[str] = None, name: Optional[str] = None,
                metadata: Optional[Mapping[str, str]] = None,
                get_or_create: bool = False,
                on_idle: Optional[str] = None,
                from_snapshot: Optional[str] = None,
                volumes: Any = None) -> c.Opening[AsyncSession]:
        """``async with client.session() as s:`` (ended on exit), or
        ``s = await client.session()`` (end it with ``await s.close()``); the options are
        :meth:`kennel.Client.session`'s (``tier=``, ``runtime=``, ``platform=``, ``image=``
        place its sandbox; ``name=``, ``metadata=`` and ``get_or_create=`` label it;
        ``on_idle=`` is what its idle TTL does; ``from_snapshot=`` makes it from a
        snapshot)."""
        body = c.session_body(limits=limits, env=env, network=network, idle_ttl=idle_ttl,
                              tier=tier, runtime=runtime, platform=platform, image=image,
                              name=name, metadata=metadata, get_or_create=get_or_create,
                              on_idle=on_idle, from_snapshot=from_snapshot,
                              volumes=volumes)

        async def create() -> AsyncSession:
            r = await self._request("POST", "/v1/sessions", json=body)
            return AsyncSession(self, SessionInfo.from_dict(r.json()))

        return c.Opening(create)

    create_session = session

    def get_or_create(self, name: str, **options: Any) -> c.Opening[AsyncSession]:
        """:meth:`kennel.Client.get_or_create`, awaited or in ``async with``."""
        return self.session(name=name, get_or_create=True, **options)

    async def list_sessions(self, *, name: Optional[str] = None,
                            metadata: Optional[Mapping[str, str]] = None) -> List[SessionInfo]:
        """:meth:`kennel.Client.list_sessions`: ``name`` and ``metadata`` filter."""
        params = c.sessions_params(name, metadata)
        r = await self._request("GET", "/v1/sessions", params=params)
        return [SessionInfo.from_dict(d) for d in r.json()]

    sessions = list_sessions

    async def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_dict((await self._request("GET", c.session_url(session_id))).json())

    async def attach(self, session_id: str) -> AsyncSession:
        return AsyncSession(self, await self.get_session(session_id))

    async def delete_session(self, session_id: str) -> None:
        await self._request("DELETE", c.session_url(session_id))

    async def fork(self, snapshot_id: str, n: int, *, idle_ttl: c.Timeout = None,
                   metadata: Optional[Mapping[str, str]] = None,
                   on_idle: Optional[str] = None) -> List[AsyncSession]:
        """``n`` sessions from one snapshot, all or none, as :meth:`kennel.Client.fork`."""
        body = c.fork_body(snapshot_id, n, idle_ttl=idle_ttl, metadata=metadata,
                           on_idle=on_idle)
        r = await self._request("POST", "/v1/sessions", json=body)
        return [AsyncSession(self, info) for info in c.forked(r.json())]

    async def list_snapshots(self) -> List[SnapshotInfo]:
        """This token's snapshots, oldest first."""
        r = await self._request("GET", c.snapshot_url())
        return [SnapshotInfo.from_dict(d) for d in r.json()]

    snapshots = list_snapshots

    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """One of this token's snapshots, as :meth:`kennel.Client.get_snapshot`."""
        return SnapshotInfo.from_dict((await self._request("GET", c.snapshot_url(snapshot_id))).json())

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Deletes a snapshot and its state; sessions made from it run on."""
        await self._request("DELETE", c.snapshot_url(snapshot_id))

    # -- volumes --------------------------------------------------------------------------

    async def create_volume(self, name: str, size: Any, *, for_: Optional[str] = None) -> VolumeInfo:
        """``POST /v1/volumes``: an ext4 volume of ``size`` ("64M", or bytes) that outlives
        sandboxes; ``for_="microvm"`` makes one for microVMs only (the default, ``host``, is
        for native and oci sandboxes). Mount it with ``volumes=[(name, "/workspace/data")]``
        on a run or a session; one read-write at a time, or read-only by any number."""
        r = await self._request("POST", "/v1/volumes", json=c.volume_body(name, size, for_))
        return VolumeInfo.from_dict(r.json())

    async def list_volumes(self) -> List[VolumeInfo]:
        """This token's volumes, by name, with who has each mounted."""
        r = await self._request("GET", "/v1/volumes")
        return [VolumeInfo.from_dict(d) for d in r.json()]

    async def get_volume(self, name: str) -> VolumeInfo:
        return VolumeInfo.from_dict((await self._request("GET", c.volume_url(name))).json())

    async def delete_volume(self, name: str) -> None:
        """Deletes a volume and its data (:class:`kennel.Conflict` while one has it mounted)."""
        await self._request("DELETE", c.volume_url(name))
