"""Python SDK for Kennel's HTTP API (``kennel serve``).

    import kennel

    client = kennel.Client("http://127.0.0.1:8080", token="...")  # or $KENNEL_TOKEN
    r = client.run_code("print(6*7)")
    assert r.stdout == "42\\n" and r.exit_code == 0

    with client.session() as s:            # a sandbox kept between steps
        s.run_code("x = 41")
        print(s.run_code("print(x + 1)").stdout)
        s.write_file("/workspace/a.txt", b"hi")
        assert s.read_file("/workspace/a.txt") == b"hi"

    with client.session(runtime="runsc") as s:  # placed as runs are: gVisor here,
        assert s.isolation.tier == "oci"        # tier="microvm" for a guest kernel

    with client.session() as s:            # rich results, as in a notebook
        r = s.run_code("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show(); 6 * 7")
        r.results[0].save("plot.png")      # the figure (r.results[0].png is its bytes)
        print(r.value.text)                # "42", the last expression's value
        print(s.run_code("1 / 0").error)   # ExecError(name="ZeroDivisionError", ...)

    with client.stream_code("print(1); print(2)") as stream:
        for chunk in stream:                # OutputChunk(stream, data, text) as it comes, and
                                            # a session exec's RichOutput as it is shown
            print(chunk.text, end="")
    print(stream.result.exit_code)          # the final RunResult, once iteration ends

:class:`AsyncClient` mirrors :class:`Client` with coroutines. Errors from the server raise
:class:`KennelError` (``status``, ``code``, ``message``), or a subclass: :class:`BadRequest`
(400), :class:`Unauthorized` (401), :class:`Forbidden` (403), :class:`NotFound` (404), :class:`SessionEnded` (410),
:class:`Busy` (429, with ``retry_after``; 429s, and 503s with ``Retry-After``, are retried
first, a bounded number of times). A server that gives no answer raises a
:class:`TransportError`: :class:`ConnectionFailed` (nothing reachable at the URL, which it
names), :class:`ConnectionLost` or :class:`RequestTimeout`.

Runs by id: ``client.submit(spec)`` starts an ``async`` run (a :class:`RunInfo`),
``client.get_run(id)`` / ``client.wait_run(id)`` follow it, ``client.cancel_run(id)`` kills it;
``verify_webhook(secret, headers, body)`` checks a signed callback.

Background processes: ``s.processes.start(cmd=...)`` (a :class:`ProcessInfo`),
``s.processes.output(pid)`` (:class:`ProcessEvent` objects to the ``exit``), ``.list()``,
``.write_stdin(pid, data, eof=True)``, ``.signal(pid, 15)``, ``.kill(pid)``.

File watch: ``with s.watch("/workspace") as w: for ev in w: ...`` (:class:`FileEvent` objects:
``create``, ``modify``, ``delete``, ``rename``, ``overflow``). Terminals: ``with s.pty() as
term:`` (a :class:`Terminal`: ``send``, ``recv``, ``read_until``, ``resize``, ``kill``);
``s.terminals.create/list/attach/kill``.

Snapshots and forks: ``s.snapshot()`` (a :class:`SnapshotInfo`), ``client.session(from_snapshot=id)``,
``client.fork(id, n)`` and ``s.fork(n)`` (a snapshot first, then ``n`` sessions from it: all
of them, or :class:`Busy` and none past the token's session quota);
``client.list_snapshots()``, ``client.get_snapshot(id)``, ``client.delete_snapshot(id)``.

Preview URLs: ``s.ports.open(3000, expires_in="1h")`` (a :class:`PortInfo`: its ``url`` and
``token``), ``s.ports.list()``, ``s.ports.revoke(3000)``.
"""

from .aio import (AsyncClient, AsyncNetwork, AsyncPorts, AsyncProcesses, AsyncSession, AsyncStream,
                  AsyncWatch)
from .client import Client, Network, Ports, Processes, Session, Stream, Watch
from .errors import (BadRequest, Busy, Conflict, ConnectionFailed, ConnectionLost, Forbidden, KennelError,
                     NotFound, RequestTimeout, SessionEnded, TransportError, Unauthorized)
from .results import (CollectedFile, ExecError, ExecResult, FileEntry, FileEvent, Interpreter,
                      Isolation, NetEvent, OutputChunk, PauseInfo, ProcessEvent, ProcessInfo,
                      ResumeReport, RichOutput, RunInfo, RunResult, SessionEnd, SessionInfo,
                      PortInfo, SnapshotInfo, VolumeInfo)
from .terminal import AsyncTerminal, AsyncTerminals, Terminal, Terminals
from .webhooks import WebhookVerificationError, verify_webhook

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "PauseInfo", "ResumeReport", "AsyncNetwork", "AsyncProcesses", "Network", "AsyncSession", "Processes", "ProcessEvent", "ProcessInfo", "AsyncStream", "BadRequest", "Busy", "Client",
    "CollectedFile", "Conflict", "ConnectionFailed", "ConnectionLost", "RequestTimeout", "TransportError", "ExecError", "ExecResult", "FileEntry", "Interpreter", "Isolation", "KennelError",
    "Forbidden", "NetEvent", "NotFound", "OutputChunk", "RichOutput", "RunResult", "Session", "SessionEnded",
    "SessionEnd", "SessionInfo", "SnapshotInfo", "Stream", "Unauthorized", "RunInfo", "WebhookVerificationError", "verify_webhook",
    "AsyncTerminal", "AsyncTerminals", "AsyncWatch", "FileEvent", "Terminal", "Terminals", "Watch",
    "VolumeInfo", "Ports", "AsyncPorts", "PortInfo",
]
