"""Terminals over WebSockets: :class:`Terminal` and :class:`Terminals`, and their asyncio
twins :class:`AsyncTerminal` and :class:`AsyncTerminals`.

A terminal is ``bash --login`` on a pty in the session's sandbox (``session.pty()``), or a
background process started with ``tty=True``. Its output comes as binary frames, its input
goes as binary frames; the connection authenticates with the client's ``Authorization``
header. PyPI's ``websockets`` carries it (``websockets.sync.client``, and its asyncio client
for the asyncio twins), imported only when a terminal is opened.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, List, Mapping, Optional, Union

from . import _common as c
from .errors import ConnectionLost
from .results import ProcessInfo

if TYPE_CHECKING:
    from .aio import AsyncClient, AsyncSession
    from .client import Client, Session


def _connect(client: "Client", path: str) -> Any:
    """The open WebSocket of an API path; a refused handshake raises the server's error."""
    try:
        from websockets.exceptions import InvalidHandshake
        from websockets.sync.client import connect
    except ImportError as e:  # the SDK's dependency, missing from this environment
        raise ImportError(c.NO_WEBSOCKETS) from e
    url, headers = c.ws_target(client._http, path)
    agent = headers.pop("User-Agent")
    try:
        # Entered as a context manager: from websockets 17 a bare connect() is a deprecated
        # form, and __enter__ gives the connection in every version.
        opening = connect(url, additional_headers=headers, user_agent_header=agent,
                          max_size=None)
        return opening.__enter__()
    except (OSError, TimeoutError, InvalidHandshake) as e:
        raise c.ws_refused(url, e) from e


class _Shell:
    """What a terminal and its asyncio twin share: its id, and what its frames said."""

    pid: int
    _feed: c.TerminalFeed

    def __repr__(self) -> str:
        return f"<kennel.{type(self).__name__} {self.pid}{' exited' if self.exited else ''}>"

    @property
    def exited(self) -> bool:
        """Whether the shell has exited (its ``exit`` event has been read)."""
        return self._feed.exited

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit status, once it exited on its own."""
        return self._feed.exit_code

    @property
    def signal(self) -> Optional[int]:
        """The signal that ended it (a kill's 9), once it has ended so."""
        return self._feed.signal

    @property
    def dropped(self) -> int:
        """How many bytes of output the server dropped because this client read too slowly."""
        return self._feed.dropped

    def _closed(self, e: Exception) -> bytes:
        """What a read gets once the socket has closed: the end of the output after a clean
        close or the shell's exit; else the connection broke."""
        from websockets.exceptions import ConnectionClosedOK

        if isinstance(e, ConnectionClosedOK) or self._feed.exited:
            return b""
        raise ConnectionLost(None, "connection_lost",
                             f"terminal {self.pid}'s connection broke ({e})") from e


class Terminal(_Shell):
    """An attached terminal: :meth:`send` keystrokes, :meth:`recv` (or iterate) output bytes
    as the shell writes them, :meth:`resize` its pty.

    Attaching replays the last 64 KiB of the terminal's output first. :meth:`close` (or
    leaving a ``with`` block) only detaches: the shell keeps running in the session, and
    :meth:`Terminals.attach` reaches it again, until :meth:`kill` or the session's end. Once
    it has exited, :attr:`exit_code` or :attr:`signal` says how.

    >>> with s.pty() as term:
    ...     term.send("echo $((6*7))\\n")
    ...     term.read_until(b"42")
    """

    def __init__(self, client: "Client", base: str, ws_path: str, pid: int):
        self._client = client
        self._base = base
        #: The terminal's id: the pid of its shell (or process) in the sandbox.
        self.pid = pid
        self._feed = c.TerminalFeed()
        self._ws = _connect(client, ws_path)

    def send(self, data: c.FileData) -> None:
        """Types ``data`` (str as UTF-8, or bytes such as ``b"\\x03"`` for Ctrl-C)."""
        self._ws.send(c.as_bytes(data))

    def recv(self, timeout: Optional[float] = None) -> bytes:
        """The next output bytes, waiting up to ``timeout`` seconds (None: as long as it
        takes; ``TimeoutError`` then); ``b""`` once the shell has exited or the connection
        closed. A control frame the server refused raises its error (the connection stays)."""
        if self._feed.pending:
            return self._feed.take()
        return self._frame(timeout)

    def _frame(self, timeout: Optional[float]) -> bytes:
        """The next output frame from the socket (past what waits in ``pending``)."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = self._ws.recv(timeout)
            except ConnectionClosed as e:
                return self._closed(e)
            out = self._feed.frame(message)
            if out:
                return out

    def __iter__(self) -> Iterator[bytes]:
        """Output chunks until the shell exits or the connection closes."""
        while True:
            chunk = self.recv()
            if not chunk:
                return
            yield chunk

    def read_until(self, pattern: Union[str, bytes], timeout: Optional[float] = 30) -> bytes:
        """Reads output until ``pattern`` shows, and returns it up to and including the
        pattern (what came after waits for the next read). ``TimeoutError`` past ``timeout``
        seconds; ``EOFError`` when the shell exits first."""
        look = c.Lookout(self._feed, c.as_bytes(pattern), timeout, self.pid)
        found = look.found()
        while found is None:
            look.add(self._frame(look.time_left()))
            found = look.found()
        return found

    def resize(self, cols: int, rows: int) -> None:
        """Resizes the pty (the shell gets SIGWINCH); :class:`kennel.BadRequest` for 0 or
        above 1000."""
        self._client._request("POST", self._base + "/resize", json=c.size_body(cols, rows))

    def kill(self) -> None:
        """Kills the shell (and its process group), then closes the connection."""
        try:
            self._client._request("DELETE", self._base)
        finally:
            self.close()

    def close(self) -> None:
        """Detaches: the connection closes, the shell keeps running."""
        self._ws.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Terminals:
    """A session's terminals (``session.terminals``): ``bash --login`` shells on ptys in
    ``/workspace`` with ``TERM=xterm-256color``, living until killed or the session ends (at
    most ``sessions.max_terminals``, 8, at once; :class:`kennel.Busy` past it).
    ``session.pty()`` creates one and attaches."""

    def __init__(self, session: "Session"):
        self._session = session

    def _request(self, method: str, url: str, **kw: Any) -> Any:
        return self._session._client._request(method, url, **kw)

    def create(self, cols: int = c.DEFAULT_COLS, rows: int = c.DEFAULT_ROWS, *,
               cwd: Optional[str] = None, user: Optional[str] = None,
               env: Optional[Mapping[str, str]] = None) -> ProcessInfo:
        """Starts a shell (``user``: ``"default"`` or ``"user"``, uid 1000, where the sandbox
        has one); its ``pid`` is the terminal's id."""
        body = c.terminal_body(cols, rows, cwd, user, env)
        r = self._request("POST", c.terminal_url(self._session.id), json=body)
        return ProcessInfo.from_dict(r.json())

    def list(self) -> List[ProcessInfo]:
        """The session's terminals."""
        r = self._request("GET", c.terminal_url(self._session.id))
        return [ProcessInfo.from_dict(d) for d in r.json()]

    def attach(self, tid: int) -> Terminal:
        """Connects to a terminal; its last 64 KiB of output come first."""
        url = c.terminal_url(self._session.id, tid)
        return Terminal(self._session._client, url, url, tid)

    def resize(self, tid: int, cols: int, rows: int) -> None:
        self._request("POST", c.terminal_url(self._session.id, tid, "/resize"),
                      json=c.size_body(cols, rows))

    def kill(self, tid: int) -> None:
        """Kills the terminal's shell and its process group."""
        self._request("DELETE", c.terminal_url(self._session.id, tid))


def attach_process(session: "Session", pid: int) -> Terminal:
    """The terminal of a background process started with ``tty=True``."""
    url = c.process_url(session.id, pid)
    return Terminal(session._client, url, url + "/pty", pid)


async def _aconnect(client: "AsyncClient", path: str) -> Any:
    """As :func:`_connect`, with websockets' asyncio client."""
    try:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake
    except ImportError as e:
        raise ImportError(c.NO_WEBSOCKETS) from e
    url, headers = c.ws_target(client._http, path)
    agent = headers.pop("User-Agent")
    try:
        return await connect(url, additional_headers=headers, user_agent_header=agent,
                             max_size=None)
    except (OSError, TimeoutError, InvalidHandshake) as e:
        raise c.ws_refused(url, e) from e


class AsyncTerminal(_Shell):
    """The asyncio twin of :class:`Terminal`: ``await term.send(...)``, ``await
    term.recv()``, ``async for chunk in term``, ``await term.read_until(b"$ ")``, ``await
    term.resize(c, r)``, ``await term.aclose()`` (detach) and ``await term.kill()``."""

    def __init__(self, client: "AsyncClient", base: str, ws: Any, pid: int):
        self._client = client
        self._base = base
        self._ws = ws
        self.pid = pid
        self._feed = c.TerminalFeed()

    @classmethod
    async def open(cls, client: "AsyncClient", base: str, ws_path: str,
                   pid: int) -> "AsyncTerminal":
        return cls(client, base, await _aconnect(client, ws_path), pid)

    async def send(self, data: c.FileData) -> None:
        await self._ws.send(c.as_bytes(data))

    async def recv(self, timeout: Optional[float] = None) -> bytes:
        """As :meth:`Terminal.recv`."""
        if self._feed.pending:
            return self._feed.take()
        return await self._frame(timeout)

    async def _frame(self, timeout: Optional[float]) -> bytes:
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = await asyncio.wait_for(self._ws.recv(), timeout)
            except ConnectionClosed as e:
                return self._closed(e)
            except asyncio.TimeoutError as e:  # not TimeoutError itself before Python 3.11
                raise TimeoutError(f"no output from terminal {self.pid} in {timeout} s") from e
            out = self._feed.frame(message)
            if out:
                return out

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.recv()
            if not chunk:
                return
            yield chunk

    async def read_until(self, pattern: Union[str, bytes],
                         timeout: Optional[float] = 30) -> bytes:
        """As :meth:`Terminal.read_until`."""
        look = c.Lookout(self._feed, c.as_bytes(pattern), timeout, self.pid)
        found = look.found()
        while found is None:
            look.add(await self._frame(look.time_left()))
            found = look.found()
        return found

    async def resize(self, cols: int, rows: int) -> None:
        await self._client._request("POST", self._base + "/resize",
                                    json=c.size_body(cols, rows))

    async def kill(self) -> None:
        try:
            await self._client._request("DELETE", self._base)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Detaches: the connection closes, the shell keeps running."""
        await self._ws.close()

    close = aclose

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncTerminals:
    """The asyncio twin of :class:`Terminals`; :meth:`attach` is ``await``-ed or used with
    ``async with``."""

    def __init__(self, session: "AsyncSession"):
        self._session = session

    async def _request(self, method: str, url: str, **kw: Any) -> Any:
        return await self._session._client._request(method, url, **kw)

    async def create(self, cols: int = c.DEFAULT_COLS, rows: int = c.DEFAULT_ROWS, *,
                     cwd: Optional[str] = None, user: Optional[str] = None,
                     env: Optional[Mapping[str, str]] = None) -> ProcessInfo:
        body = c.terminal_body(cols, rows, cwd, user, env)
        r = await self._request("POST", c.terminal_url(self._session.id), json=body)
        return ProcessInfo.from_dict(r.json())

    async def list(self) -> List[ProcessInfo]:
        r = await self._request("GET", c.terminal_url(self._session.id))
        return [ProcessInfo.from_dict(d) for d in r.json()]

    def attach(self, tid: int) -> "c.Opening[AsyncTerminal]":
        url = c.terminal_url(self._session.id, tid)
        return c.Opening(lambda: AsyncTerminal.open(self._session._client, url, url, tid))

    async def resize(self, tid: int, cols: int, rows: int) -> None:
        await self._request("POST", c.terminal_url(self._session.id, tid, "/resize"),
                            json=c.size_body(cols, rows))

    async def kill(self, tid: int) -> None:
        await self._request("DELETE", c.terminal_url(self._session.id, tid))
