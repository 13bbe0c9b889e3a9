"""What the sync and async clients share: request bodies, answers, Server-Sent Events."""

from __future__ import annotations

import base64
import email.utils
import json
import os
import time
from typing import (Any, Awaitable, Callable, Dict, Generator, Generic, Iterable, List, Mapping,
                    Optional, Sequence, Tuple, TypeVar, Union)
from urllib.parse import quote, urlencode

import httpx

from .errors import (ConnectionFailed, ConnectionLost, KennelError, RequestTimeout,
                     TransportError, error_for)
from .results import (FileEvent, Isolation, OutputChunk, ProcessEvent, ProcessInfo, RichOutput,
                      SessionEnd, SessionInfo)

# What a stream yields: output as it is written, and a python session exec's rich outputs.
Piece = Union[OutputChunk, RichOutput]

FileData = Union[str, bytes, bytearray, memoryview]
Timeout = Union[int, float, str, None]

#: The default HTTP timeout in seconds: above the server's default maximum run time (300s).
DEFAULT_TIMEOUT = 330.0
USER_AGENT = "kennel-python/0.1.0"


def token_from(token: Optional[str]) -> Optional[str]:
    """The bearer token: the argument, else ``$KENNEL_TOKEN``, else none."""
    if token is not None:
        return token or None
    return os.environ.get("KENNEL_TOKEN") or None


def headers_for(token: Optional[str]) -> Dict[str, str]:
    h = {"User-Agent": USER_AGENT}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def span(t: Timeout) -> Optional[str]:
    """A duration for the wire: numbers are seconds; strings ("30s", "500ms") pass through."""
    if t is None or isinstance(t, str):
        return t
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"a timeout is seconds (int or float) or a string like '30s', not {t!r}")
    return f"{t}s"


def content(data: FileData) -> Dict[str, str]:
    """Wire ``Content``: text as ``{"text"}``, bytes as ``{"base64"}``."""
    if isinstance(data, str):
        return {"text": data}
    if isinstance(data, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(data)).decode("ascii")}
    raise TypeError(f"file contents must be str or bytes, not {type(data).__name__}")


def network_spec(network: Any) -> Optional[Dict[str, Any]]:
    """``network=``: a dict as the API takes it, a mode (``"none"``, ``"full"``), or a list of
    domains to allow."""
    if network is None or isinstance(network, dict):
        return network
    if isinstance(network, str):
        return {"mode": network}
    if isinstance(network, (list, tuple)):
        return {"mode": "allow", "allow": list(network)}
    raise TypeError(f"network must be a dict, a mode string or a list of domains, not {network!r}")


def limits_spec(limits: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    if limits is None:
        return None
    out = dict(limits)
    if isinstance(out.get("timeout"), (int, float)) and not isinstance(out["timeout"], bool):
        out["timeout"] = span(out["timeout"])
    return out


def run_body(
    *,
    language: Optional[str] = None,
    code: Optional[str] = None,
    argv: Optional[List[str]] = None,
    stdin: Optional[str] = None,
    files: Optional[Mapping[str, FileData]] = None,
    collect: Optional[Iterable[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    limits: Optional[Mapping[str, Any]] = None,
    network: Any = None,
    image: Optional[str] = None,
    tier: Optional[str] = None,
    runtime: Optional[str] = None,
    platform: Optional[str] = None,
    rich: bool = False,
    on_violation: Optional[str] = None,
    volumes: Any = None,
) -> Dict[str, Any]:
    """A ``RunSpec`` with only the fields given; where it runs as :func:`placement` says."""
    body: Dict[str, Any] = {}
    if argv is not None:
        if isinstance(argv, str):
            raise TypeError("argv is a list of strings; use run_code(..., language='bash') for a shell line")
        body["argv"] = list(argv)
    else:
        body["language"] = language
        body["code"] = code
    if stdin is not None:
        body["stdin"] = stdin
    if files:
        body["files"] = {path: content(data) for path, data in files.items()}
    if collect:
        body["collect"] = [collect] if isinstance(collect, str) else list(collect)
    if env:
        body["env"] = dict(env)
    lim = limits_spec(limits)
    if lim:
        body["limits"] = lim
    net = network_spec(network)
    if net is not None:
        body["network"] = net
    body.update(placement(tier=tier, runtime=runtime, platform=platform, image=image))
    if rich:
        body["rich"] = True
    if on_violation is not None:
        body["on_violation"] = _text("on_violation", on_violation)
    mounts = volume_mounts(volumes)
    if mounts:
        body["volumes"] = mounts
    return body


def volume_mounts(volumes: Any) -> List[Dict[str, Any]]:
    """``volumes`` as the API takes them: a list of ``{"name", "path", "read_only"}`` dicts,
    or of ``(name, path)`` / ``(name, path, read_only)`` tuples; ``path`` beneath /workspace
    or /tmp."""
    mounts: List[Dict[str, Any]] = []
    for v in volumes or []:
        if isinstance(v, Mapping):
            mounts.append(dict(v))
        elif isinstance(v, (tuple, list)) and len(v) in (2, 3):
            mount: Dict[str, Any] = {"name": v[0], "path": v[1]}
            if len(v) == 3:
                mount["read_only"] = bool(v[2])
            mounts.append(mount)
        else:
            raise TypeError(f"a volume is a dict or a (name, path[, read_only]) tuple, not {v!r}")
    return mounts


def volume_body(name: str, size: Any, kind: Optional[str] = None) -> Dict[str, Any]:
    """``POST /v1/volumes``' body: ``size`` as "64M" or a number of bytes; ``kind`` is
    ``"host"`` (the default) or ``"microvm"``."""
    body: Dict[str, Any] = {"name": _text("name", name), "size": size}
    if kind is not None:
        body["for"] = _text("for_", kind)
    return body


def placement(*, tier: Optional[str] = None, runtime: Optional[str] = None,
              platform: Optional[str] = None, image: Optional[str] = None) -> Dict[str, str]:
    """Where a run's or a session's sandbox runs, as the API takes it: only the fields given.
    They go as they are: the server knows which tiers, runtimes, platforms and images it has,
    and answers 400 (or 404 for an image) naming the field for the others."""
    given = {"tier": tier, "runtime": runtime, "platform": platform, "image": image}
    return {name: _text(name, value) for name, value in given.items() if value is not None}


def _text(name: str, value: Any) -> str:
    """A string argument, checked for its type only: a wrong type is the caller's bug, a wrong
    value is the server's to refuse."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {value!r}")
    return value


def session_body(
    *,
    limits: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, str]] = None,
    network: Any = None,
    idle_ttl: Timeout = None,
    image: Optional[str] = None,
    tier: Optional[str] = None,
    runtime: Optional[str] = None,
    platform: Optional[str] = None,
    name: Optional[str] = None,
    metadata: Optional[Mapping[str, str]] = None,
    get_or_create: bool = False,
    on_idle: Optional[str] = None,
    from_snapshot: Optional[str] = None,
    count: Optional[int] = None,
    volumes: Any = None,
) -> Dict[str, Any]:
    """A ``SessionSpec`` with only the fields given; where it runs as :func:`placement` says.
    ``from_snapshot`` makes it from a snapshot (whose tier, image, limits, network and env it
    takes: the server refuses those beside it), ``count`` makes that many at once."""
    body: Dict[str, Any] = {}
    if from_snapshot is not None:
        body["from_snapshot"] = _text("from_snapshot", from_snapshot)
    if count is not None:
        body["count"] = _count(count)
    if name is not None:
        body["name"] = name
    if metadata:
        body["metadata"] = dict(metadata)
    if get_or_create:
        body["get_or_create"] = True
    if on_idle is not None:
        body["on_idle"] = on_idle
    lim = limits_spec(limits)
    if lim:
        body["limits"] = lim
    if env:
        body["env"] = dict(env)
    net = network_spec(network)
    if net is not None:
        body["network"] = net
    if idle_ttl is not None:
        body["idle_ttl"] = span(idle_ttl)
    body.update(placement(tier=tier, runtime=runtime, platform=platform, image=image))
    mounts = volume_mounts(volumes)
    if mounts:
        body["volumes"] = mounts
    return body


def _count(n: Any) -> int:
    """A number of sessions to make at once, checked for its type only (the server bounds
    it: 1 to 64)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"a count of sessions is an int, not {n!r}")
    return n


def fork_body(snapshot_id: str, n: int, *, idle_ttl: Timeout = None,
              metadata: Optional[Mapping[str, str]] = None,
              on_idle: Optional[str] = None) -> Dict[str, Any]:
    """The ``SessionSpec`` of a fork: ``n`` sessions from snapshot ``snapshot_id``, all of
    them or none."""
    return session_body(from_snapshot=snapshot_id, count=n, idle_ttl=idle_ttl,
                        metadata=metadata, on_idle=on_idle)


def snapshot_body(ttl: Timeout) -> Dict[str, Any]:
    """A ``SnapshotSpec``: ``ttl`` (seconds, or a string such as "1h") when given."""
    return {} if ttl is None else {"ttl": span(ttl)}


def snapshot_url(snapshot_id: Optional[str] = None) -> str:
    """``/v1/snapshots``, or one snapshot's ``/v1/snapshots/{id}``."""
    return "/v1/snapshots" if snapshot_id is None else f"/v1/snapshots/{quote(snapshot_id, safe='')}"


def forked(answer: Dict[str, Any]) -> List[SessionInfo]:
    """The sessions of a create with ``count``: ``{"sessions": [...]}``."""
    return [SessionInfo.from_dict(d) for d in answer.get("sessions", [])]


def port_url(session_id: str, port: Optional[int] = None) -> str:
    """A session's ``/ports``, or one port's ``/ports/{port}``."""
    base = session_url(session_id, "/ports")
    return base if port is None else f"{base}/{int(port)}"


def port_body(port: int, expires_in: Timeout) -> Dict[str, Any]:
    """A ``PortSpec``: the port, and ``expires_in`` (seconds, or a string such as "1h")."""
    body: Dict[str, Any] = {"port": int(port)}
    if expires_in is not None:
        body["expires_in"] = span(expires_in)
    return body


def volume_url(name: str) -> str:
    return f"/v1/volumes/{quote(name, safe='')}"


def sessions_params(name: Optional[str] = None,
                    metadata: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``GET /v1/sessions``' filters: ``metadata`` as E2B writes it, one parameter whose value
    is itself a URL-encoded query (``user=abc&app=prod``)."""
    params: Dict[str, str] = {}
    if name is not None:
        params["name"] = name
    if metadata:
        params["metadata"] = urlencode(dict(metadata))
    return params


class SessionFields:
    """What :class:`kennel.Session` and :class:`kennel.AsyncSession` read from their
    :class:`SessionInfo` (``info``, as of creation or the last ``refresh``)."""

    info: SessionInfo

    @property
    def isolation(self) -> Optional[Isolation]:
        """The isolation the session's sandbox runs under, as a run's result reports it:
        ``isolation.tier`` (``"native"``, ``"oci"``, ``"microvm"``), ``isolation.runtime``
        (``{"name": "runsc", ...}`` in the oci tier), ``isolation.accel`` (``"kvm"`` or
        ``"tcg"``) in a microVM."""
        return self.info.isolation

    @property
    def name(self) -> Optional[str]:
        """The session's name, unique among the token's open sessions; ``None`` without one."""
        return self.info.name

    @property
    def metadata(self) -> Dict[str, str]:
        """The session's labels, as it was created with them."""
        return self.info.metadata

    @property
    def ended(self) -> Optional[SessionEnd]:
        """Set once the sandbox has died on its own (an OOM kill, a crash), as of the last
        ``refresh``: why. Its execs then raise :class:`kennel.SessionEnded`."""
        return self.info.ended


def exec_body(language: str, code: str, stdin: Optional[str], timeout: Timeout,
              figure_formats: Optional[Sequence[str]] = None,
              user: Optional[str] = None) -> Dict[str, Any]:
    """An ``ExecSpec``; ``user`` ("default" or "user", uid 1000) only when given."""
    body: Dict[str, Any] = {"language": language, "code": code}
    if user is not None:
        body["user"] = user
    if stdin is not None:
        body["stdin"] = stdin
    if timeout is not None:
        body["timeout"] = span(timeout)
    if figure_formats is not None:
        body["figure_formats"] = list(figure_formats)
    return body


def sandbox_dir(path: str) -> str:
    """A sandbox directory: relative paths are under /workspace."""
    return path if path.startswith("/") else "/workspace/" + path.lstrip("./")


def tar_of_dir(local: str) -> bytes:
    """A local directory's contents as a tar archive (names relative to it)."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in sorted(os.listdir(local)):
            tar.add(os.path.join(local, name), arcname=name)
    return out.getvalue()


def extract_tar(data: bytes, local: str) -> None:
    """Extracts an archive into local, refusing members that would land outside it, links
    that point out of it, and devices (tarfile's ``data`` filter, or its checks where this
    Python lacks it)."""
    import io
    import tarfile

    os.makedirs(local, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(local, filter="data")
            return
        root = os.path.realpath(local)

        def inside(path: str) -> bool:
            return path == root or path.startswith(root + os.sep)

        for m in tar.getmembers():
            dest = os.path.normpath(os.path.join(root, m.name))
            points_to = os.path.normpath(os.path.join(os.path.dirname(dest), m.linkname))
            if not inside(dest) or m.isdev() or m.islnk() or (m.issym() and not inside(points_to)):
                raise ValueError(f"refusing {m.name!r}: it would reach outside {local}")
        tar.extractall(local)


def file_url(session_id: str, path: str) -> str:
    """``/v1/sessions/{id}/files/{path}`` for a sandbox path. Absolute paths are taken as they
    are (``/workspace/a.txt``, ``/tmp/x``); relative ones are relative to the sandbox's working
    directory, ``/workspace`` (``a.txt``), except that ``workspace/...`` and ``tmp/...`` name
    ``/workspace/...`` and ``/tmp/...``, as in the API's URLs."""
    if path.startswith("/"):
        p = path.lstrip("/")
    elif path.startswith(("workspace/", "tmp/")):
        p = path
    else:
        p = "workspace/" + path
    return f"/v1/sessions/{quote(session_id, safe='')}/files/{quote(p, safe='/')}"


def session_url(session_id: str, suffix: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}{suffix}"


def retry_after(response: httpx.Response) -> Optional[float]:
    """The answer's ``Retry-After`` in seconds: a number, or an HTTP date from now."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(when.timestamp() - time.time(), 0.0)


#: How many times an answer that says "later" is retried before its error is raised.
DEFAULT_RETRIES = 3
#: The longest wait before one retry: a server that asks for more is not waited for (its
#: :class:`~kennel.Busy` error, with ``retry_after``, is raised at once).
DEFAULT_MAX_RETRY_WAIT = 30.0
#: The first wait when the answer names none; it doubles with each retry.
FIRST_BACKOFF = 0.5


class Retry:
    """Which answers the clients send again, and how long they wait first.

    A 429 (the server or this token is busy) and a 503 that says when to come back
    (``Retry-After``) refused the request before anything ran, so sending it again is safe.
    The wait is the answer's ``Retry-After``, else a backoff doubling from
    :data:`FIRST_BACKOFF`; at most ``retries`` retries, none longer than ``max_wait``.
    """

    def __init__(self, retries: int = DEFAULT_RETRIES,
                 max_wait: float = DEFAULT_MAX_RETRY_WAIT):
        if retries < 0:
            raise ValueError(f"retries must be 0 or more, not {retries!r}")
        self.retries = retries
        self.max_wait = max_wait

    def delay(self, response: httpx.Response, attempt: int) -> Optional[float]:
        """Seconds to wait before sending again after ``response`` (the answer to try number
        ``attempt``, from 0), or ``None`` to keep the answer."""
        if attempt >= self.retries:
            return None
        after = retry_after(response)
        status = response.status_code
        if status != 429 and not (status == 503 and after is not None):
            return None
        wait = after if after is not None else FIRST_BACKOFF * 2 ** attempt
        return wait if wait <= self.max_wait else None


def server_of(request: httpx.Request) -> str:
    """The server a request went to, as a URL (scheme, host, port)."""
    return f"{request.url.scheme}://{request.url.netloc.decode('ascii', 'replace')}"


def transport_error(request: httpx.Request, e: httpx.TransportError) -> TransportError:
    """The :class:`TransportError` for a request that got no answer."""
    server = server_of(request)
    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ConnectionFailed(
            server, "connection_failed",
            f"cannot connect to the Kennel server at {server} ({e or type(e).__name__}): is "
            f"`kennel serve` running there? (the client's base_url, else $KENNEL_URL)")
    if isinstance(e, httpx.TimeoutException):
        return RequestTimeout(
            server, "timeout",
            f"no answer from the Kennel server at {server} to {request.method} "
            f"{request.url.path} within the client's timeout ({type(e).__name__}); give the "
            f"client a longer timeout than the run's own")
    return ConnectionLost(
        server, "connection_lost",
        f"the connection to the Kennel server at {server} broke during {request.method} "
        f"{request.url.path} ({e or type(e).__name__})")


def error_from(response: httpx.Response, body: bytes) -> KennelError:
    """The error an answer with a 4xx/5xx status stands for, with the server's message."""
    return error_of(response.status_code, body, response.reason_phrase, retry_after(response))


def error_of(status: int, body: bytes, reason: str,
             after: Optional[float] = None) -> KennelError:
    """The error a 4xx/5xx answer with this body stands for: the server's code and message
    from its JSON ``error``, else the body's text (``reason`` when it has none)."""
    code, message = "http_error", ""
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace").strip() or reason
    return error_for(status, code, message, after)


def check(response: httpx.Response) -> httpx.Response:
    """Raises the server's error for a non-2xx answer (whose body has been read)."""
    if response.status_code >= 400:
        raise error_from(response, response.content)
    return response


class SSEParser:
    """Server-Sent Events, fed line by line; ``feed`` returns an ``(event, data)`` when a
    blank line completes one."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: List[str] = []

    def feed(self, line: str) -> Optional[Tuple[str, str]]:
        line = line.rstrip("\r\n")
        if not line:
            if not self.data:
                self.event = "message"
                return None
            out = (self.event, "\n".join(self.data))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None  # a comment: keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None

    def finish(self) -> Optional[Tuple[str, str]]:
        return self.feed("") if self.data else None


def sse_events(parser: SSEParser, line: Optional[str]) -> List[Tuple[str, str]]:
    """The events one line read from a stream completes (``None``: the stream has ended); a
    "line" may hold several when the transport split on ``\r``."""
    if line is None:
        ev = parser.finish()
        return [ev] if ev is not None else []
    found = (parser.feed(piece) for piece in line.splitlines() or [""])
    return [ev for ev in found if ev is not None]


class Outcome:
    """What one SSE event means: a chunk or a rich output, the final result's JSON, or an
    error raised. The ``result`` event repeats none of the output the stream carried (its
    ``stdout``, ``stderr`` and ``results`` are empty): :meth:`collect` keeps that output and
    puts it back into the result."""

    def __init__(self) -> None:
        self.output: Dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.shown: List[Any] = []

    def collect(self, event: str, data: str) -> Tuple[Optional[Piece], Optional[Dict[str, Any]]]:
        """:meth:`decode`, keeping the output for the result."""
        piece, result = self.decode(event, data)
        if isinstance(piece, OutputChunk):
            self.output[piece.stream] += piece.data
        elif piece is not None:
            self.shown.append(json.loads(data))
        if result is not None:
            for name, raw in self.output.items():
                if not result.get(name):
                    result[name] = raw.decode("utf-8", "replace")
            if self.shown:
                result["results"] = self.shown
        return piece, result

    @staticmethod
    def decode(event: str, data: str) -> Tuple[Optional[Piece], Optional[Dict[str, Any]]]:
        if event in ("stdout", "stderr"):
            d = json.loads(data)
            raw = base64.b64decode(d["b64"]) if "b64" in d else d.get("text", "").encode()
            text = d.get("text")
            if text is None:
                text = raw.decode("utf-8", "replace")
            return OutputChunk(event, raw, text), None
        if event == "display":
            return RichOutput.from_dict(json.loads(data)), None
        if event == "result":
            return None, json.loads(data)
        if event == "error":
            try:
                d = json.loads(data)
                code, message = str(d.get("code", "error")), str(d.get("message", data))
            except ValueError:
                code, message = "error", data
            raise error_for(None, code, message)
        return None, None  # an event this SDK does not know: ignored


def process_body(argv: Optional[Sequence[str]], cmd: Optional[str], cwd: Optional[str],
                 env: Optional[Mapping[str, str]], stdin: bool, timeout: Timeout,
                 user: Optional[str] = None, tty: bool = False, cols: Optional[int] = None,
                 rows: Optional[int] = None) -> Dict[str, Any]:
    """A ``ProcessSpec``: ``argv``, or ``cmd`` for ``bash -c``, and only the options given
    (``cols`` and ``rows`` size a ``tty`` process's pty)."""
    if (argv is None) == (cmd is None):
        raise TypeError("give argv (a list of strings) or cmd (a bash command line), not both")
    if isinstance(argv, str):
        raise TypeError("argv is a list of strings; use cmd= for a shell line")
    body: Dict[str, Any] = {"argv": list(argv)} if argv is not None else {"cmd": cmd}
    if cwd is not None:
        body["cwd"] = sandbox_dir(cwd)
    if env:
        body["env"] = dict(env)
    if stdin:
        body["stdin"] = True
    if timeout is not None:
        body["timeout"] = span(timeout)
    if user is not None:
        body["user"] = user
    if tty:
        body["tty"] = True
        body.update(size_body(cols, rows))
    return body


def stdin_body(data: FileData, eof: bool) -> Dict[str, Any]:
    """A ``ProcessInput``: text as text, bytes as base64."""
    body: Dict[str, Any] = {"eof": bool(eof)}
    if isinstance(data, str):
        if data:
            body["data"] = {"text": data}
    elif len(data):
        body["data"] = {"base64": base64.b64encode(bytes(data)).decode("ascii")}
    return body


def process_url(session_id: str, pid: Optional[int] = None, suffix: str = "") -> str:
    tail = "" if pid is None else f"/{int(pid)}"
    return session_url(session_id, f"/processes{tail}{suffix}")


class ProcessFollower:
    """Reads a process's output stream line by line into :class:`ProcessEvent` objects, and
    keeps the offsets after the last output event, to resume from after a dropped
    connection."""

    def __init__(self, stdout_offset: int, stderr_offset: int, reconnects: int):
        self.offsets = {"stdout": stdout_offset, "stderr": stderr_offset}
        self.exited = False
        self._parser = SSEParser()
        self._reconnects = reconnects
        self._failures = 0

    def request(self, http: Any, url: str) -> httpx.Request:
        """The request that (re)opens the stream where it was; a half-read event of the last
        connection is dropped."""
        self._parser = SSEParser()
        params = {"stdout_offset": self.offsets["stdout"],
                  "stderr_offset": self.offsets["stderr"]}
        return http.build_request("GET", url, params=params,
                                  headers={"Accept": "text/event-stream"})

    def broke(self, request: httpx.Request, e: Optional[httpx.TransportError]) -> None:
        """The connection broke (``e``) or ended before the exit: raises once that has
        happened more than ``reconnects`` times in a row, else the stream is opened again."""
        self._failures += 1
        if self._failures <= self._reconnects:
            return
        if e is not None:
            raise transport_error(request, e) from e
        raise KennelError(None, "stream_ended", "the output stream ended before the exit event")

    def feed(self, line: Optional[str]) -> List[ProcessEvent]:
        """The events a line of the stream completes (``None``: the stream has ended)."""
        if line is None:
            ev = self._parser.finish()
            return self._event(*ev) if ev is not None else []
        out: List[ProcessEvent] = []
        for ev in sse_events(self._parser, line):
            out.extend(self._event(*ev))
        if out:
            self._failures = 0
        return out

    def _event(self, event: str, data: str) -> List[ProcessEvent]:
        if event in ("stdout", "stderr"):
            d = json.loads(data)
            raw = base64.b64decode(d["b64"]) if "b64" in d else d.get("text", "").encode()
            text = d.get("text")
            offset = int(d.get("offset", self.offsets[event]))
            self.offsets[event] = offset + len(raw)
            return [ProcessEvent(event, raw, raw.decode("utf-8", "replace") if text is None
                                 else text, offset, event)]
        if event == "dropped":
            d = json.loads(data)
            return [ProcessEvent("dropped", stream=d.get("stream"), bytes=int(d.get("bytes", 0)))]
        if event == "exit":
            self.exited = True
            return [ProcessEvent("exit", info=ProcessInfo.from_dict(json.loads(data)))]
        if event == "error":
            self.exited = True
            Outcome.decode(event, data)  # raises the server's error
        return []


def watch_params(path: str, recursive: bool) -> Dict[str, str]:
    """A watch's query: its directory (relative paths are under /workspace) and whether it
    follows subdirectories."""
    return {"path": sandbox_dir(path), "recursive": "true" if recursive else "false"}


def stream_timeout(http: Any) -> httpx.Timeout:
    """The client's timeouts without the read timeout: a stream that waits for something to
    happen (a quiet watched directory) is not an error however long it is quiet."""
    t = http.timeout
    return httpx.Timeout(connect=t.connect, read=None, write=t.write, pool=t.pool)


class WatchReader:
    """Reads a watch's event stream line by line into :class:`FileEvent` objects. ``ready``
    is set by the first ``watching`` event: from then on no change is missed."""

    def __init__(self) -> None:
        self.ready = False
        self.path: Optional[str] = None
        self.recursive: Optional[bool] = None
        self._parser = SSEParser()

    def feed(self, line: Optional[str]) -> List[FileEvent]:
        """The events a line completes (``None``: the stream has ended); an ``error`` event
        (the session ended) raises the server's error."""
        out: List[FileEvent] = []
        for event, data in sse_events(self._parser, line):
            if event == "watching":
                d = json.loads(data)
                self.ready, self.path, self.recursive = True, d.get("path"), d.get("recursive")
            elif event in ("create", "modify", "delete", "rename", "overflow"):
                out.append(FileEvent.from_dict(event, json.loads(data)))
            elif event == "error":
                Outcome.decode(event, data)  # raises the server's error
        return out


# -- terminals ---------------------------------------------------------------------------

#: What a terminal without PyPI's websockets installed says.
NO_WEBSOCKETS = "terminals need PyPI's websockets (14 or later): pip install 'websockets>=14'"

#: A new terminal's size when none is given, as the server's own default.
DEFAULT_COLS, DEFAULT_ROWS = 80, 24


def size_body(cols: Optional[int], rows: Optional[int]) -> Dict[str, int]:
    """A pty size, only the sides given; the server refuses 0 and above 1000 (400)."""
    given = {"cols": cols, "rows": rows}
    return {name: int(v) for name, v in given.items() if v is not None}


def terminal_body(cols: Optional[int], rows: Optional[int], cwd: Optional[str],
                  user: Optional[str], env: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    """A ``TerminalSpec`` with only the fields given."""
    body: Dict[str, Any] = dict(size_body(cols, rows))
    if cwd is not None:
        body["cwd"] = sandbox_dir(cwd)
    if user is not None:
        body["user"] = _text("user", user)
    if env:
        body["env"] = dict(env)
    return body


def terminal_url(session_id: str, tid: Optional[int] = None, suffix: str = "") -> str:
    tail = "" if tid is None else f"/{int(tid)}"
    return session_url(session_id, f"/terminals{tail}{suffix}")


def ws_target(http: Any, path: str) -> Tuple[str, Dict[str, str]]:
    """The WebSocket URL of an API path on the client's server (``ws://`` for ``http://``,
    ``wss://`` for ``https://``) and the headers that authenticate it: the client's own
    ``Authorization`` (a browser, which cannot set it, sends the token as the subprotocol
    ``kennel.token.<token>`` instead)."""
    base = str(http.base_url).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"the client's base URL {base!r} is not http:// or https://")
    headers = {"User-Agent": http.headers.get("user-agent", USER_AGENT)}
    auth = http.headers.get("authorization")
    if auth:
        headers["Authorization"] = auth
    return "ws" + base[len("http"):] + path, headers


def with_query(path: str, params: Mapping[str, Any]) -> str:
    given = {k: v for k, v in params.items() if v is not None}
    return f"{path}?{urlencode(given)}" if given else path


def ws_refused(url: str, e: BaseException) -> KennelError:
    """The error for a WebSocket that did not open: the server's answer to the handshake (a
    :class:`NotFound` for an unknown terminal, say), or a :class:`ConnectionFailed`."""
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        body = getattr(response, "body", None) or b""
        reason = getattr(response, "reason_phrase", "") or f"HTTP {status}"
        after = response.headers.get("Retry-After") if response.headers is not None else None
        try:
            wait = float(after) if after is not None else None
        except ValueError:
            wait = None
        return error_of(status, bytes(body), reason, wait)
    server = url.split("/v1/", 1)[0]
    return ConnectionFailed(server, "connection_failed",
                            f"cannot open the WebSocket {url} ({e or type(e).__name__}): is "
                            f"`kennel serve` running there?")


class TerminalFeed:
    """What a terminal's WebSocket carries from the server: binary frames are its output,
    text frames JSON events: ``exit`` (then the server closes), ``error`` (a control frame
    it refused; the connection stays) and ``dropped`` (output this client was too slow for,
    counted in ``dropped``). Output read past what a caller wanted waits in ``pending``."""

    def __init__(self) -> None:
        self.dropped = 0
        self.exited = False
        self.exit_code: Optional[int] = None
        self.signal: Optional[int] = None
        self.pending = bytearray()

    def frame(self, message: Union[str, bytes]) -> Optional[bytes]:
        """The output bytes a frame carries, or None for an event."""
        if isinstance(message, (bytes, bytearray, memoryview)):
            return bytes(message)
        try:
            ev = json.loads(message)
        except ValueError:
            return None
        if ev.get("type") == "exit":
            self.exited = True
            self.exit_code, self.signal = ev.get("exit_code"), ev.get("signal")
        elif ev.get("type") == "dropped":
            self.dropped += int(ev.get("bytes") or 0)
        elif ev.get("type") == "error":
            raise error_for(ev.get("status"), "terminal_error", str(ev.get("message", message)))
        return None

    def take(self) -> bytes:
        """What waits in ``pending``, now taken."""
        out = bytes(self.pending)
        self.pending.clear()
        return out

    def until(self, pattern: bytes) -> Optional[bytes]:
        """The pending output up to and including ``pattern``, taken, once it is there."""
        at = self.pending.find(pattern)
        if at < 0:
            return None
        out = bytes(self.pending[:at + len(pattern)])
        del self.pending[:at + len(pattern)]
        return out


def as_bytes(data: FileData) -> bytes:
    """Input for a terminal: text as UTF-8, bytes as they are."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


class Lookout:
    """A wait for ``pattern`` in a terminal's output: what :meth:`found` does not show yet,
    a read within :meth:`time_left` is :meth:`add`-ed to."""

    def __init__(self, feed: TerminalFeed, pattern: bytes, timeout: Optional[float], pid: int):
        self.feed, self.pattern, self.pid = feed, pattern, pid
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def found(self) -> Optional[bytes]:
        """The output up to and including the pattern, taken, once it is there."""
        return self.feed.until(self.pattern)

    def time_left(self) -> Optional[float]:
        """Seconds left for the next read (None: no limit); TimeoutError once none is."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"terminal {self.pid} did not show {self.pattern!r} in time; its "
                               f"last output: {bytes(self.feed.pending[-200:])!r}")
        return left

    def add(self, chunk: bytes) -> None:
        """A read's output; ``b""`` (the shell has exited) raises EOFError."""
        if not chunk:
            raise EOFError(f"terminal {self.pid} ended before {self.pattern!r} showed; its last "
                           f"output: {bytes(self.feed.pending[-200:])!r}")
        self.feed.pending += chunk


T = TypeVar("T")


class Opening(Generic[T]):
    """What an asyncio call that opens something returns (a session, a watch, a terminal):
    ``await`` it for the thing, or ``async with`` it to have the thing closed on exit (by
    its own ``__aexit__``)."""

    def __init__(self, create: Callable[[], Awaitable[T]]):
        self._create = create
        self._opened: Optional[Any] = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._create().__await__()

    async def __aenter__(self) -> T:
        self._opened = await self._create()
        return self._opened

    async def __aexit__(self, *exc: Any) -> None:
        if self._opened is not None:
            await self._opened.__aexit__(*exc)


def network_update_body(network: Any, resolve: Optional[Sequence[str]]) -> Dict[str, Any]:
    """The body of ``PATCH /v1/sessions/{id}/network``: the whole network, as ``network=``
    takes it at creation (``None`` is mode ``none``), with ``resolve``'s pins."""
    body = dict(network_spec(network) or {"mode": "none"})
    if resolve is not None:
        body["resolve"] = list(resolve)
    return body


def pause_body(keep: Optional[str]) -> Dict[str, Any]:
    """A ``PauseSpec``: ``keep`` (``"saved"`` or ``"frozen"``) when given."""
    return {} if keep is None else {"keep": keep}
