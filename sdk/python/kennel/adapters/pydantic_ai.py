"""A pydantic-ai workspace backend on a Kennel session.

Install it from the repository root with ``pip install './sdk/python[pydantic-ai]'``.

pydantic-ai runs an agent's commands and file operations in a *workspace*
(``pydantic_ai.workspaces``): a backend object with ``run`` (``SupportsCommands``), the file
methods of ``SupportsFilesystem`` and ``realpath`` (``SupportsRealpath``). Here the environment
is one Kennel session, named by ``WorkspaceRef(provider="kennel", id=<session id>)``::

    import kennel
    from pydantic_ai import Agent
    from kennel.adapters.pydantic_ai import KennelWorkspace

    workspace = KennelWorkspace(kennel.Client())         # tools: run_command, read_file, write_file
    agent = Agent("openai:gpt-5.2", capabilities=[workspace])
    result = agent.run_sync("How many lines has /etc/passwd?")
    workspace.close()                                      # ends the sessions its runs made

A Kennel session answers one request at a time, so a command is not one long exec: it is started
detached (``setsid``) with its output in files under ``/tmp``, then waited for in short execs.
Between them, file operations and other commands of the same workspace get through, a
cancelled or timed-out command's process group is killed, and background processes it leaves
run on, as pydantic-ai's contract asks. Files go through Kennel's file API; what that API
refuses by design (symlinks, paths outside ``/workspace`` and ``/tmp``, making directories) is
done by a small ``python3 -I`` helper inside the sandbox, which reports ``errno`` exactly.
"""

from __future__ import annotations

import errno
import io
import json
import posixpath
import re
import shlex
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from pydantic_ai import FunctionToolset, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.workspaces import (CommandResult, FileEntry, SupportsCommands, SupportsFilesystem,
                                    SupportsRealpath, WorkspaceBackend, WorkspaceCommand,
                                    WorkspaceError, WorkspaceOutputLimitError, WorkspaceRef,
                                    WorkspaceTimeoutError, WorkspaceUnavailableError)

import kennel

__all__ = ["KennelWorkspace", "KennelWorkspaceBackend", "PROVIDER", "workspace_tools"]

PROVIDER = "kennel"
WORKING_DIR = "/workspace"
_ROOTS = ("/workspace", "/tmp")  # what Kennel's file API reaches
_RUNS = "/tmp/.kennel-pydantic-ai"  # a command's pid, status, stdout and stderr, while it runs
_SLICE = 0.5  # seconds one waiting exec may hold the session (others queue behind it)
_MAX_OUTPUT = 10 * 1024 * 1024  # stdout + stderr of one command, as pydantic-ai's local backend
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ERRNO = re.compile(r"(E[A-Z0-9]+): (.*)", re.S)
T = TypeVar("T")

# The command runs in its own session (so it outlives the exec that starts it, and its process
# group can be killed alone); "pid" appears once it has left the exec's group, "status" when it
# ends. `setsid` is util-linux; python3 (the session agent's own interpreter) stands in without it.
_WRAPPER = ('d=$1; wd=$2; shift 2; echo $$ > "$d/pid.tmp" && mv "$d/pid.tmp" "$d/pid"; '
            '({exports}cd -- "$wd" && exec "$@") < /dev/null > "$d/out" 2> "$d/err"; '
            'echo $? > "$d/status.tmp"; mv "$d/status.tmp" "$d/status"')
_LAUNCH = ('d={d}; mkdir -p "$d" || exit 1; '
           'if command -v setsid > /dev/null 2>&1; then set -- setsid; else set -- /usr/bin/python3 -Ic '
           '"import os, sys; os.setsid(); os.execv(sys.argv[1], sys.argv[1:])"; fi; '
           '"$@" /bin/sh -c {wrapper} sh "$d" {wd} {argv} < /dev/null > /dev/null 2>&1 & '
           'i=0; until [ -e "$d/pid" ] || [ -e "$d/status" ]; do i=$((i + 1)); '
           '[ $i -le 2000 ] || break; sleep 0.005; done; ')
_WAIT = ('d={d}; i=0; while [ ! -e "$d/status" ] && [ -e "$d/pid" ] && [ $i -lt {ticks} ]; do '
         'sleep 0.01; i=$((i + 1)); done; '
         'if [ -e "$d/status" ]; then echo done; elif [ -e "$d/pid" ]; then echo running; else echo lost; fi')
_KILL = 'd={d}; p=$(cat "$d/pid" 2> /dev/null) && kill -9 "-$p" 2> /dev/null; {rm}true'

# File operations Kennel's file API does not do, with os semantics (symlinks followed, errno kept).
_HELPER = r'''
import errno, json, os, shutil, stat, sys
def entry(p):
    m = os.stat(p)
    d = stat.S_ISDIR(m.st_mode)
    return {"dir": d, "size": None if d else m.st_size}
def probe(p):
    try:
        return entry(p)
    except OSError:
        return None
def regular(p):
    if not stat.S_ISREG(os.stat(p).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", p)
def write(src, dst):
    if os.path.isdir(dst):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", dst)
    if os.path.exists(dst):
        regular(dst)
    parent = os.path.dirname(dst)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", dst)
    os.makedirs(parent, exist_ok=True)
    shutil.copyfile(src, dst)  # in place: the file keeps its mode and links
def remove(p, wd):
    target = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
    if target == wd or wd.startswith(target.rstrip("/") + "/"):
        return "refused"
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    else:
        os.unlink(p)
def read(src, dst):
    regular(src)
    shutil.copyfile(src, dst)
ops = {"realpath": os.path.realpath, "stat": entry, "mkdir": lambda p: os.makedirs(p, exist_ok=True),
       "list": lambda p: [[e.name, probe(e.path)] for e in sorted(os.scandir(p), key=lambda e: e.name)],
       "probe": lambda *ps: [probe(p) for p in ps], "read": read, "write": write, "remove": remove}
try:
    print(json.dumps({"ok": ops[sys.argv[1]](*sys.argv[2:])}))
except OSError as e:
    print(json.dumps({"errno": e.errno, "message": e.strerror or str(e), "path": e.filename}))
'''


class _Symlink(Exception):
    """Kennel's file API refused the path because it is, or passes through, a symlink."""


def _absolute(path: str, normalize: bool = True) -> str:
    if not isinstance(path, str) or not posixpath.isabs(path):
        raise ValueError(f"path must be absolute, got {path!r}")
    return posixpath.normpath(path) if normalize else path


def _under_roots(path: str) -> bool:
    """Whether the file API reaches ``path`` (strictly under /workspace or /tmp)."""
    return any(path.startswith(root + "/") for root in _ROOTS)


def _os_error(number: int | None, message: str, path: str) -> OSError:
    # OSError(errno, ...) builds the matching subclass: FileNotFoundError, IsADirectoryError...
    return OSError(number, message, path) if number else OSError(f"{message}: {path!r}")


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name: {name!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"environment variable {name} must be a string without NUL")
    return env


class KennelWorkspaceBackend(WorkspaceBackend, SupportsCommands, SupportsFilesystem, SupportsRealpath):
    """A pydantic-ai workspace backend whose environment is one Kennel session.

    Built without I/O: the first operation creates the session (or, given ``ref``, attaches to
    it, raising ``WorkspaceUnavailableError`` if it is gone). The backend never ends the session
    on its own; :meth:`close` (or ``async with``) does, and Kennel's idle TTL ends one left open.
    ``env`` is added to every command's environment; ``session_options`` go to
    ``Client.session`` (``limits``, ``network``, ``image``, ``idle_ttl``). Commands start in
    /workspace, shell strings run with bash (sh without it), and a command given no ``timeout``
    runs as long as the session lives: the session's per-exec time limit does not apply to it.
    """

    def __init__(self, client: kennel.Client, *, ref: WorkspaceRef | None = None,
                 env: Mapping[str, str] | None = None, **session_options: Any):
        if ref is not None and ref.provider != PROVIDER:
            raise ValueError(f"not a kennel workspace ref: {ref!r}")
        self._client = client
        self._ref = ref
        self._env = _check_env(env)
        self._options = session_options
        self._session: kennel.Session | None = None
        self._lock = threading.Lock()  # one session, even for concurrent first operations
        self._closed = False

    @property
    def ref(self) -> WorkspaceRef | None:
        return self._ref

    # -- the session --------------------------------------------------------------------

    def _open(self) -> kennel.Session:
        with self._lock:
            if self._closed:
                raise WorkspaceUnavailableError("this kennel workspace was closed")
            if self._session is None:
                if self._ref is None:
                    self._session = self._client.session(**self._options)
                    self._ref = WorkspaceRef(provider=PROVIDER, id=self._session.id)
                else:
                    try:
                        self._session = self._client.attach(self._ref.id)
                    except kennel.NotFound:
                        raise WorkspaceUnavailableError(
                            f"kennel session {self._ref.id} does not exist (any more)") from None
            return self._session

    def _gone(self, session: kennel.Session) -> bool:
        try:
            self._client.get_session(session.id)
            return False
        except kennel.NotFound:
            return True

    def _sync(self, op: Callable[[kennel.Session], T], path: str | None = None) -> T:
        """Runs ``op`` on the session (in a worker thread), as pydantic-ai's errors."""
        session = self._open()
        try:
            return op(session)
        except kennel.BadRequest as e:
            found = _ERRNO.match(e.message) if path is not None else None
            if found is None:
                raise
            name, message = found.groups()
            if name == "ELOOP":
                raise _Symlink() from None
            raise _os_error(getattr(errno, name, None), message, path) from None
        except kennel.KennelError as e:
            if isinstance(e, kennel.SessionEnded) or self._closed or self._gone(session):
                raise WorkspaceUnavailableError(f"kennel session {session.id} has ended") from e
            if isinstance(e, kennel.NotFound) and path is not None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
            raise

    async def _call(self, op: Callable[[kennel.Session], T], path: str | None = None) -> T:
        return await anyio.to_thread.run_sync(self._sync, op, path)

    async def _shell(self, script: str, timeout: float = 60) -> kennel.ExecResult:
        result = await self._call(lambda s: s.run_code(script, "sh", timeout=timeout))
        if result.timed_out:
            raise WorkspaceError(f"a kennel exec timed out: {script[:80]!r}")
        return result

    async def _helper(self, op: str, *args: str) -> Any:
        script = shlex.join(["/usr/bin/python3", "-Ic", _HELPER, op, *args])
        result = await self._shell(script)
        try:
            answer = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise WorkspaceError(f"the sandbox's file helper failed: {result.stderr.strip()}") from None
        if "errno" in answer:
            raise _os_error(answer["errno"], answer["message"], answer.get("path") or args[0])
        return answer["ok"]

    async def working_dir(self) -> str:
        await self._call(lambda s: None)
        return WORKING_DIR

    def close(self) -> None:
        """Ends the session (whoever holds the ref decides when; this is that call)."""
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            session.close()
        elif self._ref is not None:  # attached by ref but never used: end it all the same
            try:
                self._client.delete_session(self._ref.id)
            except kennel.NotFound:
                pass

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.close)

    async def __aenter__(self) -> KennelWorkspaceBackend:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __enter__(self) -> KennelWorkspaceBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- commands -----------------------------------------------------------------------

    async def run(self, command: WorkspaceCommand, *, shell: bool = False,
                  env: Mapping[str, str] | None = None, timeout: float | None = None) -> CommandResult:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 < timeout < float("inf")):
            raise ValueError("timeout must be a positive finite number or None")
        if isinstance(command, str) != shell:
            raise TypeError("a string command requires shell=True, and an argv sequence shell=False")
        argv = ["/bin/sh", "-c", 'exec "$(command -v bash || echo /bin/sh)" -c "$1"', "sh", command] \
            if shell else list(command)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise (ValueError if not argv else TypeError)("argv must be a non-empty sequence of str")
        if any("\0" in a for a in argv):
            raise ValueError("a command cannot contain NUL bytes")
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in {**self._env, **_check_env(env)}.items())
        run_dir = f"{_RUNS}/{uuid.uuid4().hex}"  # no character that needs quoting
        deadline = None if timeout is None else time.monotonic() + timeout
        launch = _LAUNCH.format(d=run_dir, wrapper=shlex.quote(_WRAPPER.format(exports=exports)),
                                wd=shlex.quote(WORKING_DIR), argv=shlex.join(argv))
        collected = False
        try:
            answer = await self._shell(launch + self._wait(run_dir, deadline))
            state = answer.stdout.strip()
            while state == "running":
                if deadline is not None and time.monotonic() >= deadline:
                    await self._shell(_KILL.format(d=run_dir, rm=""))
                    collected = True
                    out, err, _ = await self._collect(run_dir)
                    raise WorkspaceTimeoutError(f"command timed out after {timeout:g}s and was killed",
                                                stdout=out, stderr=err)
                answer = await self._shell(self._wait(run_dir, deadline))
                state = answer.stdout.strip()
            if state != "done":
                raise WorkspaceError(f"the command could not be started or followed in {run_dir}: "
                                     f"{answer.stderr.strip() or state or 'no answer'}")
            collected = True
            out, err, status = await self._collect(run_dir)
            return CommandResult(exit_code=status, stdout=out, stderr=err)
        except BaseException as error:
            if not collected and not isinstance(error, WorkspaceUnavailableError):
                # Cancelled (or failed) while it runs: stop its process group, drop its files.
                with anyio.move_on_after(10, shield=True):
                    try:
                        await self._shell(_KILL.format(d=run_dir, rm='rm -rf "$d"; '))
                    except Exception:
                        pass
            raise

    @staticmethod
    def _wait(run_dir: str, deadline: float | None) -> str:
        left = _SLICE if deadline is None else min(_SLICE, max(0.0, deadline - time.monotonic()))
        return _WAIT.format(d=run_dir, ticks=int(left / 0.01))

    async def _collect(self, run_dir: str) -> tuple[str, str, int]:
        """The output and exit status a command left, read as one archive; its files are then removed."""
        try:
            sizes = {e.name: e.size for e in await self._call(lambda s: s.list_files(run_dir), run_dir)}
            if sizes.get("out", 0) + sizes.get("err", 0) > _MAX_OUTPUT:
                raise WorkspaceOutputLimitError(
                    "command output passed 10 MiB; redirect it to a file and read part of it",
                    limit=_MAX_OUTPUT)
            archive = await self._call(lambda s: s.download_archive(run_dir), run_dir)
        finally:
            await self._discard(run_dir)
        members: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member) if member.isfile() else None
                if data is not None:
                    members[posixpath.basename(member.name)] = data.read()
        status = members.get("status", b"").strip()
        out, err = (members.get(n, b"").decode("utf-8", "replace") for n in ("out", "err"))
        return out, err, int(status) if status.isdigit() else -1

    async def _discard(self, path: str) -> None:
        """Removes a file or tree of ours, even when the caller is being cancelled."""
        with anyio.move_on_after(10, shield=True):
            try:
                await self._call(lambda s: s.delete_file(path), path)
            except Exception:
                pass

    # -- files --------------------------------------------------------------------------

    async def _entry(self, path: str) -> kennel.FileEntry | None:
        """``path``'s entry in its directory's listing (not followed if it is a symlink)."""
        name = posixpath.basename(path)
        entries = await self._call(lambda s: s.list_files(posixpath.dirname(path)), path)
        return next((e for e in entries if e.name == name), None)

    async def _staged(self, op: Callable[[str], Any]) -> Any:
        stage = f"{_RUNS}/{uuid.uuid4().hex}.stage"
        try:
            return await op(stage)
        finally:
            await self._discard(stage)

    async def read_bytes(self, path: str) -> bytes:
        path = _absolute(path)
        if _under_roots(path):
            try:
                return await self._call(lambda s: s.read_file(path), path)
            except _Symlink:
                pass

        async def via(stage: str) -> bytes:
            await self._helper("read", path, stage)
            return await self._call(lambda s: s.read_file(stage), stage)
        return await self._staged(via)

    async def write_bytes(self, path: str, data: bytes) -> None:
        path, data = _absolute(path), bytes(data)
        if _under_roots(path):
            try:
                entry = await self._entry(path)
            except (FileNotFoundError, NotADirectoryError):
                entry = None  # the file API makes the parents, or says ENOTDIR itself
            except _Symlink:
                entry = kennel.FileEntry(name="", type="symlink", size=0, mode=0)
            if entry is not None and entry.type == "dir":
                raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
            # The file API replaces a file whole, with mode 0644: right unless a mode or link is kept.
            if entry is None or (entry.type == "file" and entry.mode & 0o7777 == 0o644):
                try:
                    return await self._call(lambda s: s.write_file(path, data), path)
                except _Symlink:
                    pass

        async def via(stage: str) -> None:
            await self._call(lambda s: s.write_file(stage, data), stage)
            await self._helper("write", stage, path)
        await self._staged(via)

    async def stat(self, path: str) -> FileEntry:
        path = _absolute(path)
        name = posixpath.basename(path)
        if _under_roots(path):
            try:
                entry = await self._entry(path)
            except _Symlink:
                entry = None
            else:
                if entry is None:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            if entry is not None and entry.type in ("file", "dir"):
                is_dir = entry.type == "dir"
                return FileEntry(name=name, path=path, is_dir=is_dir, size=None if is_dir else entry.size)
        info = await self._helper("stat", path)
        return FileEntry(name=name, path=path, is_dir=info["dir"], size=info["size"])

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        path = _absolute(path)
        if _under_roots(path) or path in _ROOTS:
            try:
                entries = await self._call(lambda s: s.list_files(path), path)
            except _Symlink:
                pass
            else:
                links = [e.name for e in entries if e.type == "symlink"]
                followed = dict(zip(links, await self._helper(
                    "probe", *(posixpath.join(path, n) for n in links)))) if links else {}
                rows = [[e.name, followed[e.name] if e.name in followed
                         else {"dir": e.type == "dir", "size": None if e.type == "dir" else e.size}]
                        for e in entries]
                return self._entries(path, rows)
        return self._entries(path, await self._helper("list", path))

    @staticmethod
    def _entries(path: str, rows: list[list[Any]]) -> tuple[FileEntry, ...]:
        # A symlink whose target is missing (or a loop) is listed, as a non-directory of no size.
        return tuple(FileEntry(name=name, path=posixpath.join(path, name), is_dir=bool(info and info["dir"]),
                               size=info["size"] if info else None) for name, info in rows)

    async def make_dir(self, path: str) -> None:
        await self._helper("mkdir", _absolute(path))

    async def remove(self, path: str) -> None:
        path = _absolute(path)
        if path == "/" or WORKING_DIR == path or WORKING_DIR.startswith(path + "/"):
            raise ValueError("cannot remove the workspace root or its ancestor")
        if _under_roots(path):
            try:
                return await self._call(lambda s: s.delete_file(path), path)
            except _Symlink:
                pass
        if await self._helper("remove", path, WORKING_DIR) == "refused":
            raise ValueError("cannot remove the workspace root or its ancestor")

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            if e.errno == errno.ELOOP:
                return False
            raise

    async def realpath(self, path: str) -> str:
        # Not normalized first: `link/..` climbs from the link's target, as in the shell.
        return await self._helper("realpath", _absolute(path, normalize=False))


def workspace_tools() -> FunctionToolset[Any]:
    """Tools that reach the run's workspace (``ctx.workspace``), whatever its backend.

    Path-level failures are returned to the model as ``{"error": ...}`` for it to act on;
    ``WorkspaceUnavailableError`` (the session is gone) ends the run.
    """
    toolset: FunctionToolset[Any] = FunctionToolset()

    @toolset.tool
    async def run_command(ctx: RunContext[Any], command: str, timeout: float = 60) -> dict[str, Any]:
        """Run a bash command line in the sandbox, starting in /workspace.

        Args:
            command: The command line, e.g. `python3 script.py > out.txt`.
            timeout: Seconds before the command is killed.
        """
        try:
            result = await ctx.workspace.run(command, shell=True, timeout=timeout)
        except WorkspaceTimeoutError as e:
            return {"error": str(e), "stdout": e.stdout, "stderr": e.stderr}
        except WorkspaceOutputLimitError as e:
            return {"error": str(e)}
        return {"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}

    @toolset.tool
    async def read_file(ctx: RunContext[Any], path: str) -> dict[str, Any]:
        """Read a text file of the sandbox (relative paths are under /workspace)."""
        try:
            return {"content": (await ctx.workspace.read_bytes(path)).decode("utf-8", "replace")}
        except OSError as e:
            return {"error": str(e)}

    @toolset.tool
    async def write_file(ctx: RunContext[Any], path: str, content: str) -> dict[str, Any]:
        """Write a text file in the sandbox, making its directories (relative paths are under /workspace)."""
        try:
            data = content.encode("utf-8")
            await ctx.workspace.write_bytes(path, data)
            return {"path": await ctx.workspace.resolve(path), "bytes": len(data)}
        except OSError as e:
            return {"error": str(e)}

    return toolset


@dataclass
class KennelWorkspace(AbstractCapability[Any]):
    """Gives an agent's runs a Kennel session as their workspace, and (``tools=True``) the
    ``run_command``, ``read_file`` and ``write_file`` tools to use it.

    Each run without a ref gets a fresh session; a run continuing a conversation attaches to the
    session named in its message history (a ref of another provider is left to other
    capabilities). :meth:`close` ends every session this capability's runs used.
    """

    client: kennel.Client
    _: KW_ONLY
    env: Mapping[str, str] | None = None
    session_options: Mapping[str, Any] | None = None
    tools: bool = True
    id: str | None = "kennel_workspace"
    _backends: list[KennelWorkspaceBackend] = field(default_factory=list, init=False, repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live client

    @classmethod
    def combine(cls, capabilities: Sequence[AbstractCapability[Any]]) -> AbstractCapability[Any]:
        return capabilities[-1]  # the later configuration wins whole, as LocalWorkspace's

    def get_toolset(self) -> FunctionToolset[Any] | None:
        return workspace_tools() if self.tools else None

    def get_workspace(self, ctx: RunContext[Any], *, ref: WorkspaceRef | None) -> WorkspaceBackend | None:
        if ref is not None and ref.provider != PROVIDER:
            return None
        backend = KennelWorkspaceBackend(self.client, ref=ref, env=self.env, **dict(self.session_options or {}))
        self._backends.append(backend)
        return backend

    def close(self) -> None:
        backends, self._backends = self._backends, []
        for backend in backends:
            backend.close()

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.close)
