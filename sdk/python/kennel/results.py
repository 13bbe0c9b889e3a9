"""Typed results of the Kennel HTTP API, as dataclasses.

Each class has a ``from_dict`` that builds it from the server's JSON and keeps that JSON in
``raw``, so fields a newer server adds are never lost.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def _content_bytes(content: Optional[Dict[str, str]]) -> Optional[bytes]:
    """The bytes of a wire ``Content``: ``{"text": ...}`` or ``{"base64": ...}``."""
    if content is None:
        return None
    if "text" in content:
        return content["text"].encode("utf-8")
    if "base64" in content:
        return base64.b64decode(content["base64"])
    raise ValueError(f"unknown content shape: {content!r}")


@dataclass
class CollectedFile:
    """A file returned from the sandbox (``collect=[...]``).

    ``data`` is its bytes (``None`` when the file could not be returned; ``error`` says why).
    """

    path: str
    size: int
    data: Optional[bytes]
    truncated: bool
    error: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def text(self) -> Optional[str]:
        """``data`` decoded as UTF-8 (invalid bytes replaced), or ``None``."""
        return None if self.data is None else self.data.decode("utf-8", "replace")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "CollectedFile":
        return cls(
            path=d["path"],
            size=d.get("size", 0),
            data=_content_bytes(d.get("content")),
            truncated=d.get("truncated", False),
            error=d.get("error"),
            raw=d,
        )


@dataclass
class Isolation:
    """Which isolation was really in force for a run or a session. ``raw`` holds the full
    object."""

    tier: str
    namespaces: List[str]
    host_uid: Optional[int]
    host_gid: Optional[int]
    id_range: Optional[int]
    seccomp: Dict[str, Any]
    landlock: Dict[str, Any]
    limits: Dict[str, Any]
    no_new_privs: bool
    capabilities: List[str]
    filesystem: str
    network: str
    #: The image the root came from, ``{"name", "digest"}``, for runs with an ``image``.
    image: Optional[Dict[str, str]] = None
    #: How a microvm guest's CPU ran: ``"kvm"`` (hardware virtualisation) or ``"tcg"``
    #: (QEMU's emulation, which QEMU gives no isolation guarantee); ``None`` in other tiers.
    accel: Optional[str] = None
    #: The oci tier's runtime, ``{"name", "version"}`` (and ``"platform"`` for runsc); in the
    #: microvm tier the VMM's (``"qemu-microvm"``).
    runtime: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def seccomp_enforced(self) -> bool:
        return bool(self.seccomp.get("enforced"))

    @property
    def landlock_enforced(self) -> bool:
        return bool(self.landlock.get("enforced"))

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Isolation":
        return cls(
            tier=d.get("tier", ""),
            namespaces=list(d.get("namespaces", [])),
            host_uid=d.get("host_uid"),
            host_gid=d.get("host_gid"),
            id_range=d.get("id_range"),
            seccomp=dict(d.get("seccomp") or {}),
            landlock=dict(d.get("landlock") or {}),
            limits=dict(d.get("limits") or {}),
            no_new_privs=d.get("no_new_privs", False),
            capabilities=list(d.get("capabilities", [])),
            filesystem=d.get("filesystem", ""),
            network=d.get("network", ""),
            image=d.get("image"),
            accel=d.get("accel"),
            runtime=d.get("runtime"),
            raw=d,
        )


@dataclass
class NetEvent:
    """One connection the sandbox asked Kennel's proxy for (network mode ``allow``)."""

    host: str
    port: int
    protocol: str
    decision: str
    reason: str
    address: Optional[str]
    bytes_up: int
    bytes_down: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def allowed(self) -> bool:
        return self.decision == "allowed"

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "NetEvent":
        return cls(
            host=d.get("host", ""),
            port=d.get("port", 0),
            protocol=d.get("protocol", ""),
            decision=d.get("decision", ""),
            reason=d.get("reason", ""),
            address=d.get("address"),
            bytes_up=d.get("bytes_up", 0),
            bytes_down=d.get("bytes_down", 0),
            raw=d,
        )


@dataclass
class RunResult:
    """What a one-shot run did (``POST /v1/runs``).

    ``exit_code`` is ``None`` when the program was killed by a signal (``signal``) or timed out.
    """

    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    oom_killed: bool
    pids_limit_hit: bool
    duration_ms: int
    cpu_ms: int
    memory_peak_bytes: int
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    files: List[CollectedFile]
    isolation: Isolation
    network_log: List[NetEvent]
    #: A ``rich=True`` run's rich outputs, error as data and truncation, as an exec's.
    results: List["RichOutput"] = field(default_factory=list)
    error: Optional["ExecError"] = None
    results_truncated: bool = False
    #: The run's id (``DELETE /v1/runs/{id}`` cancels it while it runs), and whether it was
    #: cancelled (its sandbox killed: the code ended by SIGKILL).
    id: Optional[str] = None
    cancelled: bool = False
    #: What the policy stopped (``{"syscalls_watched", "events": [{"kind": "denied_syscall",
    #: "syscall", "count", ...}, {"kind": "limit_hit", "limit"}, ...]}``), the programs the code
    #: executed (``[{"path", "argv0"}]``, advisory), and ``"tripwire:SYSCALL"`` when a tripwire
    #: killed the sandbox (``on_violation="kill"``).
    security_events: Dict[str, Any] = field(default_factory=dict)
    exec_log: List[Dict[str, str]] = field(default_factory=list)
    killed_by: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """True when the program exited 0 within its limits."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def denied_syscalls(self) -> Dict[str, int]:
        """The system calls the sandbox denied, with how often the code made each."""
        return {e["syscall"]: e["count"] for e in self.security_events.get("events", [])
                if e.get("kind") == "denied_syscall"}

    @property
    def value(self) -> Optional["RichOutput"]:
        """A rich run's last expression value, if the code ended with one."""
        return next((r for r in self.results if r.kind == "value"), None)

    def file(self, path: str) -> CollectedFile:
        """The collected file at ``path`` (``KeyError`` when it was not collected)."""
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "RunResult":
        return cls(
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            timed_out=d.get("timed_out", False),
            oom_killed=d.get("oom_killed", False),
            pids_limit_hit=d.get("pids_limit_hit", False),
            duration_ms=d.get("duration_ms", 0),
            cpu_ms=d.get("cpu_ms", 0),
            memory_peak_bytes=d.get("memory_peak_bytes", 0),
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            stdout_bytes=d.get("stdout_bytes", 0),
            stderr_bytes=d.get("stderr_bytes", 0),
            stdout_truncated=d.get("stdout_truncated", False),
            stderr_truncated=d.get("stderr_truncated", False),
            files=[CollectedFile.from_dict(f) for f in d.get("files", [])],
            isolation=Isolation.from_dict(d.get("isolation") or {}),
            network_log=[NetEvent.from_dict(e) for e in d.get("network_log", [])],
            results=[RichOutput.from_dict(r) for r in d.get("results") or []],
            error=ExecError.from_dict(d["error"]) if d.get("error") else None,
            results_truncated=d.get("results_truncated", False),
            id=d.get("id"),
            cancelled=d.get("cancelled", False),
            security_events=d.get("security_events") or {},
            exec_log=list(d.get("exec_log") or []),
            killed_by=d.get("killed_by"),
            raw=d,
        )


@dataclass
class RunInfo:
    """A run by id (``GET /v1/runs/{id}``, and what an ``async`` run's callback is sent):
    ``status`` is ``running``, ``finished``, ``failed``, ``cancelled`` or ``lost``; ``result``
    once it has one (``finished``, ``cancelled``), ``error`` (``{"code", "message"}``) when it
    failed or was lost."""

    id: str
    status: str
    created_at_unix_ms: int = 0
    finished_at_unix_ms: Optional[int] = None
    result: Optional[RunResult] = None
    error: Optional[Dict[str, str]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        return self.status != "running"

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "RunInfo":
        return cls(
            id=d["id"],
            status=d["status"],
            created_at_unix_ms=d.get("created_at_unix_ms", 0),
            finished_at_unix_ms=d.get("finished_at_unix_ms"),
            result=RunResult.from_dict(d["result"]) if d.get("result") else None,
            error=d.get("error"),
            raw=d,
        )


@dataclass
class Interpreter:
    """For python execs: whether the persistent interpreter crashed or was restarted."""

    restarted: bool
    crashed: bool
    reason: Optional[str]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Interpreter":
        return cls(
            restarted=d.get("restarted", False),
            crashed=d.get("crashed", False),
            reason=d.get("reason"),
        )


@dataclass
class RichOutput:
    """A rich output of a python session exec: the last expression's value (``kind ==
    "value"``) or something displayed (``"display"``: ``display(obj)``, a matplotlib figure),
    as a MIME bundle in ``data``. ``png`` and ``jpeg`` are bytes; the text types are str.
    """

    kind: str
    data: Dict[str, Any]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def text(self) -> Optional[str]:
        return self.data.get("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self.data.get("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self.data.get("text/markdown")

    @property
    def latex(self) -> Optional[str]:
        return self.data.get("text/latex")

    @property
    def svg(self) -> Optional[str]:
        return self.data.get("image/svg+xml")

    @property
    def json(self) -> Any:
        return self.data.get("application/json")

    @property
    def png(self) -> Optional[bytes]:
        return self._binary("image/png")

    @property
    def jpeg(self) -> Optional[bytes]:
        return self._binary("image/jpeg")

    def _binary(self, mime: str) -> Optional[bytes]:
        b64 = self.data.get(mime)
        return base64.b64decode(b64) if isinstance(b64, str) else None

    def save(self, path: str) -> str:
        """Writes the output's image (png, else jpeg, else svg) to ``path``; returns the MIME
        type written. Raises ValueError when the output has no image."""
        for mime, data in (("image/png", self.png), ("image/jpeg", self.jpeg),
                           ("image/svg+xml", (self.svg or "").encode("utf-8") or None)):
            if data is not None:
                with open(path, "wb") as f:
                    f.write(data)
                return mime
        raise ValueError(f"this output has no image: it has {sorted(self.data)}")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "RichOutput":
        return cls(kind=d.get("kind", "display"), data=dict(d.get("data") or {}), raw=d)


@dataclass
class ExecError:
    """The exception a python exec ended with, as data (its traceback is on stderr too)."""

    name: str
    value: str
    traceback: List[str]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecError":
        return cls(name=d.get("name", ""), value=d.get("value", ""),
                   traceback=list(d.get("traceback") or []))


@dataclass
class ExecResult:
    """What an exec in a session did (``POST /v1/sessions/{id}/exec``). A python exec also
    has ``results`` (its rich outputs, in order), ``error`` (its exception as data) and
    ``results_truncated`` (rich outputs were dropped for the output limit)."""

    exit_code: Optional[int]
    signal: Optional[int]
    timed_out: bool
    duration_ms: int
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    interpreter: Optional[Interpreter]
    results: List[RichOutput] = field(default_factory=list)
    error: Optional[ExecError] = None
    results_truncated: bool = False
    #: The exec was ended by ``cancel`` (or its client going away), not by its timeout.
    cancelled: bool = False
    #: The sandbox ran out of memory during the exec (files in /workspace and /tmp count).
    oom_killed: bool = False
    #: The session's proxied connections that ended since its previous exec, and each change
    #: of its network (``protocol == "policy"``); empty without an allowlist.
    network_log: List[NetEvent] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.cancelled

    @property
    def value(self) -> Optional[RichOutput]:
        """The last expression's value, if the code ended with one."""
        return next((r for r in self.results if r.kind == "value"), None)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecResult":
        interp = d.get("interpreter")
        error = d.get("error")
        return cls(
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            timed_out=d.get("timed_out", False),
            duration_ms=d.get("duration_ms", 0),
            stdout=d.get("stdout", ""),
            stderr=d.get("stderr", ""),
            stdout_bytes=d.get("stdout_bytes", 0),
            stderr_bytes=d.get("stderr_bytes", 0),
            stdout_truncated=d.get("stdout_truncated", False),
            stderr_truncated=d.get("stderr_truncated", False),
            interpreter=Interpreter.from_dict(interp) if interp is not None else None,
            results=[RichOutput.from_dict(r) for r in d.get("results") or []],
            error=ExecError.from_dict(error) if error is not None else None,
            results_truncated=d.get("results_truncated", False),
            cancelled=d.get("cancelled", False),
            oom_killed=d.get("oom_killed", False),
            network_log=[NetEvent.from_dict(e) for e in d.get("network_log") or []],
            raw=d,
        )


@dataclass
class SessionEnd:
    """How a session's sandbox died on its own (its execs then raise
    :class:`kennel.SessionEnded`): ``reason`` (``"oom_killed"``, ``"pids_limit"``, ``"killed"``
    or ``"crashed"``), when the server saw it, and the agent's exit status or the signal that
    killed it."""

    reason: str
    ended_at_unix_ms: int
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SessionEnd":
        return cls(
            reason=d.get("reason", ""),
            ended_at_unix_ms=d.get("ended_at_unix_ms", 0),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            raw=d,
        )


@dataclass
class SessionInfo:
    """A session as the server lists it.

    ``isolation`` is the isolation its sandbox runs under, as a run's result reports it
    (``isolation.tier``, ``isolation.runtime["name"]``); ``ended`` is set once the sandbox
    has died on its own, and says why. ``name`` (unique among the token's open sessions) and
    ``metadata`` are as it was created with them.
    """

    id: str
    created_at_unix_ms: int
    idle_ttl_s: int
    max_lifetime_s: int
    expires_in_s: int
    limits: Dict[str, Any]
    isolation: Optional[Isolation] = None
    ended: Optional[SessionEnd] = None
    name: Optional[str] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    state: str = "running"
    on_idle: str = "end"
    paused: Optional["PauseInfo"] = None
    last_resume: Optional["ResumeReport"] = None
    #: Its network now (``mode``, ``allow``, ``resolve``): as created, or as the last
    #: ``session.network.update(...)`` set it.
    network: Optional[Dict[str, Any]] = None
    #: How many times its network was changed while it ran.
    network_changes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SessionInfo":
        iso, end = d.get("isolation"), d.get("ended")
        return cls(
            id=d["id"],
            created_at_unix_ms=d.get("created_at_unix_ms", 0),
            idle_ttl_s=d.get("idle_ttl_s", 0),
            max_lifetime_s=d.get("max_lifetime_s", 0),
            expires_in_s=d.get("expires_in_s", 0),
            limits=dict(d.get("limits") or {}),
            isolation=Isolation.from_dict(iso) if iso is not None else None,
            ended=SessionEnd.from_dict(end) if end is not None else None,
            name=d.get("name"),
            metadata=dict(d.get("metadata") or {}),
            state=d.get("state", "running"),
            on_idle=d.get("on_idle", "end"),
            paused=PauseInfo.from_dict(d["paused"]) if d.get("paused") else None,
            last_resume=(ResumeReport.from_dict(d["last_resume"])
                         if d.get("last_resume") else None),
            network=d.get("network"),
            network_changes=d.get("network_changes", 0),
            raw=d,
        )


@dataclass
class PauseInfo:
    """A paused session: how it is kept (``keep``: ``saved`` or ``frozen``), by what
    ``mechanism`` (``qemu-migrate``, ``runsc-checkpoint``, ``freezer``, ``docker-pause``),
    what was ``kept`` (``memory``, ``processes``, ``files``, ``connections``: each a bool),
    and whether it ``survives_restart`` of the server."""

    keep: str
    mechanism: str
    kept: Dict[str, bool]
    survives_restart: bool
    generation: int
    took_ms: int
    state_bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PauseInfo":
        return cls(keep=d["keep"], mechanism=d["mechanism"], kept=dict(d.get("kept") or {}),
                   survives_restart=bool(d.get("survives_restart")),
                   generation=d.get("generation", 0), took_ms=d.get("took_ms", 0),
                   state_bytes=d.get("state_bytes", 0), raw=d)


@dataclass
class ResumeReport:
    """What a resume brought back: ``memory`` (``restored``, ``resident`` when it was frozen,
    or ``not_kept``), the background ``processes_running``, whether ``files_restored``, and,
    for a saved state, whether its ``digests_matched`` (``None`` when there was none to
    check) and how long verifying it took (``verify_ms``)."""

    keep: str
    mechanism: str
    memory: str
    processes_running: int
    files_restored: bool
    digests_matched: Optional[bool]
    generation: int
    verify_ms: int
    took_ms: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ResumeReport":
        return cls(keep=d["keep"], mechanism=d["mechanism"], memory=d["memory"],
                   processes_running=d.get("processes_running", 0),
                   files_restored=bool(d.get("files_restored")),
                   digests_matched=d.get("digests_matched"),
                   generation=d.get("generation", 0), verify_ms=d.get("verify_ms", 0),
                   took_ms=d.get("took_ms", 0), raw=d)


@dataclass
class SnapshotInfo:
    """A snapshot of a session (``session.snapshot()``), which sessions are made from
    (``client.session(from_snapshot=id)``, ``client.fork(id, n)``).

    ``mechanism`` says what it holds: ``qemu-migrate`` (microvm) or ``runsc-checkpoint``
    (runsc without a network) keep the memory and files, ``files`` keeps ``/workspace`` and
    ``/tmp`` only; ``kept`` is what a session made from it gets back (``memory``,
    ``processes``, ``files``, ``connections``: each a bool). ``fresh`` is what each such
    session gets afresh: ``entropy``, ``clock`` and ``python_random`` (bools) and
    ``boot_id`` (``own`` in a microVM, ``host`` where the sandbox shares the host's, ``absent``
    under gVisor). Clones of a snapshot with memory share the interpreter's string-hash secret
    (``PYTHONHASHSEED``). ``state_bytes`` count against the token's ``quota.disk`` until the
    snapshot is deleted or expires (``expires_at_unix_ms``)."""

    id: str
    session: str
    mechanism: str
    kept: Dict[str, bool]
    fresh: Dict[str, Any]
    created_at_unix_ms: int
    expires_at_unix_ms: int
    state_bytes: int
    took_ms: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        return cls(id=d["id"], session=d.get("session", ""), mechanism=d["mechanism"],
                   kept=dict(d.get("kept") or {}), fresh=dict(d.get("fresh") or {}),
                   created_at_unix_ms=d.get("created_at_unix_ms", 0),
                   expires_at_unix_ms=d.get("expires_at_unix_ms", 0),
                   state_bytes=d.get("state_bytes", 0), took_ms=d.get("took_ms", 0), raw=d)


@dataclass
class PortInfo:
    """A session's port opened to previews (``session.ports.open(3000)``): ``url`` is where a
    browser opens it (the host form ``{port}-{session}.{domain}`` where the server has a
    ``ports.domain``, else the path form ``/p/{session}/{port}/``), its ``token`` in the query;
    the token opens that port of that session only, and no API route, until
    ``expires_at_unix_ms`` or a revoke."""

    port: int
    url: str
    token: str
    expires_at_unix_ms: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PortInfo":
        return cls(port=d["port"], url=d["url"], token=d["token"],
                   expires_at_unix_ms=d.get("expires_at_unix_ms", 0), raw=d)


@dataclass
class FileEntry:
    """One entry of a session directory listing."""

    name: str
    type: str
    size: int
    mode: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "FileEntry":
        return cls(
            name=d.get("name", ""),
            type=d.get("type", ""),
            size=d.get("size", 0),
            mode=d.get("mode", 0),
            raw=d,
        )


@dataclass
class OutputChunk:
    """A piece of output as it was produced, from a streamed run or exec.

    ``stream`` is ``"stdout"`` or ``"stderr"``; ``data`` the exact bytes; ``text`` them decoded
    (invalid UTF-8 replaced, as the server does).
    """

    stream: str
    data: bytes
    text: str


@dataclass
class ProcessInfo:
    """A background process of a session (``session.processes``), as the server lists it.

    ``state`` is ``"running"`` or ``"exited"``; once exited, ``exit_code`` (it exited on its
    own), or ``signal`` (a signal ended it; ``timed_out`` if its ``timeout`` did) says how, and
    ``usage`` holds ``{"cpu_ms", "memory_peak_bytes"}``. Times are milliseconds since the Unix
    epoch. A terminal (``session.terminals``), or a process started with ``tty=True``, has
    ``terminal`` or ``tty`` set: ``tty`` is its size, ``{"cols", "rows"}``.
    """

    pid: int
    argv: List[str]
    state: str
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    started_at_unix_ms: int = 0
    ended_at_unix_ms: Optional[int] = None
    stdin: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    usage: Optional[Dict[str, int]] = None
    terminal: bool = False
    tty: Optional[Dict[str, int]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ProcessInfo":
        return cls(
            pid=d["pid"],
            argv=list(d.get("argv", [])),
            state=d.get("state", "running"),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            timed_out=d.get("timed_out", False),
            started_at_unix_ms=d.get("started_at_unix_ms", 0),
            ended_at_unix_ms=d.get("ended_at_unix_ms"),
            stdin=d.get("stdin", False),
            stdout_bytes=d.get("stdout_bytes", 0),
            stderr_bytes=d.get("stderr_bytes", 0),
            usage=d.get("usage"),
            terminal=bool(d.get("terminal", False)),
            tty=d.get("tty"),
            raw=d,
        )


@dataclass
class ProcessEvent:
    """One event of a background process's output (``session.processes.output(pid)``).

    ``kind`` is ``"stdout"`` or ``"stderr"`` (``data`` the bytes, ``text`` them decoded,
    ``offset`` the first byte's offset in its stream), ``"dropped"`` (``stream`` lost
    ``bytes`` older than the server keeps), or last ``"exit"`` (``info``: the ended
    :class:`ProcessInfo`).
    """

    kind: str
    data: bytes = b""
    text: str = ""
    offset: int = 0
    stream: Optional[str] = None
    bytes: int = 0
    info: Optional[ProcessInfo] = None


@dataclass
class FileEvent:
    """One change under a watched directory (``session.watch()``).

    ``kind`` is ``"create"``, ``"modify"`` (a run of writes to one file is one), ``"delete"``,
    ``"rename"`` (``path`` moved to ``to``) or ``"overflow"`` (``lost`` events were dropped,
    by the kernel or the watch's ring; ``path`` is then None). ``dir`` says whether the path
    is a directory; ``seq`` is the event's number in its watch.
    """

    kind: str
    path: Optional[str] = None
    to: Optional[str] = None
    dir: Optional[bool] = None
    lost: int = 0
    seq: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, kind: str, d: Dict[str, Any]) -> "FileEvent":
        return cls(kind=str(d.get("type", kind)), path=d.get("path"), to=d.get("to"),
                   dir=d.get("dir"), lost=int(d.get("lost") or 0), seq=int(d.get("seq", 0)),
                   raw=d)


@dataclass
class VolumeInfo:
    """A volume: its ``name``, ``size_bytes``, ``kind`` (``host`` or ``microvm``, the API's
    ``for``), when it was made, and ``attached``: the sandboxes that have it mounted now
    (``{"by": "session ID" | "run ID", "read_only": bool}``)."""

    name: str
    size_bytes: int
    kind: str
    created_at_unix_ms: int
    attached: List[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "VolumeInfo":
        return cls(name=d["name"], size_bytes=d["size_bytes"], kind=d.get("for", "host"),
                   created_at_unix_ms=d.get("created_at_unix_ms", 0),
                   attached=list(d.get("attached") or []), raw=d)
