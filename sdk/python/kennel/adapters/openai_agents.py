"""Kennel as a sandbox backend of the OpenAI Agents SDK (``pip install './sdk/python[openai-agents]'``).

The SDK's ``SandboxAgent`` runs its shell and file tools through a ``BaseSandboxSession`` made
by a ``BaseSandboxClient``. :class:`KennelSandboxClient` makes :class:`KennelSandboxSession`
objects, each backed by one Kennel session: ``exec`` runs in that session's bash, ``read`` and
``write`` use its files API, and ``persist_workspace``/``hydrate_workspace`` move the
workspace as one tar archive, so the SDK's snapshots (``LocalSnapshotSpec`` and so on) work::

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from kennel.adapters.openai_agents import KennelSandboxClient

    agent = SandboxAgent(name="coder", instructions="...", model="gpt-5")
    run_config = RunConfig(sandbox=SandboxRunConfig(client=KennelSandboxClient()))
    result = Runner.run_sync(agent, "count the lines of notes.txt", run_config=run_config)

The Kennel calls go through the synchronous :class:`kennel.Client` in worker threads, so one
client serves every event loop (``Runner.run_sync`` starts a new loop per run).
"""

from __future__ import annotations

import asyncio
import io
import shlex
import tarfile
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Optional, TypeVar, Union

from agents.sandbox.errors import (ExecTimeoutError, ExecTransportError, WorkspaceArchiveReadError,
                                   WorkspaceArchiveWriteError, WorkspaceReadNotFoundError,
                                   WorkspaceStartError, WorkspaceWriteTypeError)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.runtime_helpers import (RESOLVE_WORKSPACE_PATH_HELPER,
                                                    RuntimeHelperScript)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import (UnsafeTarMemberError, should_skip_tar_member,
                                           validate_tar_bytes)
from agents.sandbox.workspace_paths import coerce_posix_path, posix_path_as_path, sandbox_path_str
from pydantic import Field

import kennel

__all__ = ["KennelSandboxClient", "KennelSandboxClientOptions", "KennelSandboxSession",
           "KennelSandboxSessionState"]

T = TypeVar("T")

#: Kennel serves files and archives only under these directories.
_SANDBOX_DIRS = ("/workspace", "/tmp")


class KennelSandboxClientOptions(BaseSandboxClientOptions):
    """How each Kennel session is made (``POST /v1/sessions``); kept in the session state so
    a resumed run can make an equal one when the old session has ended."""

    type: Literal["kennel"] = "kennel"
    limits: Optional[dict[str, Any]] = None
    env: Optional[dict[str, str]] = None
    network: Any = None
    image: Optional[str] = None
    idle_ttl: Union[int, float, str, None] = None


class KennelSandboxSessionState(SandboxSessionState):
    """What a run state stores to find (or remake) the Kennel session later."""

    type: Literal["kennel"] = "kennel"
    kennel_session_id: str
    options: KennelSandboxClientOptions = Field(default_factory=KennelSandboxClientOptions)


class KennelSandboxSession(BaseSandboxSession):
    """One Kennel session as the SDK's sandbox session."""

    state: KennelSandboxSessionState

    def __init__(self, *, state: KennelSandboxSessionState, kennel_session: kennel.Session):
        self.state = state
        self._kennel = kennel_session

    @property
    def kennel_session(self) -> kennel.Session:
        return self._kennel

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await asyncio.to_thread(fn, *args, **kw)

    # -- lifecycle ------------------------------------------------------------------------

    async def _prepare_backend_workspace(self) -> None:
        # A manifest root other than /workspace itself may not exist yet.
        root = sandbox_path_str(self.state.manifest.root)
        try:
            r = await self._call(self._kennel.run_command, f"mkdir -p -- {shlex.quote(root)}")
        except kennel.KennelError as e:
            raise WorkspaceStartError(path=Path(root), cause=e) from e
        if r.exit_code != 0:
            raise WorkspaceStartError(path=Path(root), context={"stderr": r.stderr},
                                      message=f"failed to start session: mkdir {root} failed")

    async def running(self) -> bool:
        if self._kennel.closed:
            return False
        try:
            await self._call(self._kennel.refresh)
        except kennel.KennelError:
            return False
        return True

    async def _shutdown_backend(self) -> None:
        # The SDK calls this from aclose() and from the runner's cleanup; the Kennel session
        # is deleted here (closing twice does nothing).
        try:
            await self._call(self._kennel.close)
        except kennel.KennelError:
            pass

    # -- exec -----------------------------------------------------------------------------

    async def _exec_internal(self, *command: Union[str, Path],
                             timeout: Optional[float] = None) -> ExecResult:
        # Every exec starts in the workspace root with the manifest's environment, as the
        # SDK's other backends do; Kennel's bash would otherwise keep the last exec's cwd.
        env = await self.state.manifest.environment.resolve()
        line = shlex.join(str(c) for c in command)
        if env:
            pairs = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
            line = f"env -- {pairs} {line}"
        line = f"cd {shlex.quote(sandbox_path_str(self.state.manifest.root))} && {line}"
        wire_timeout = None if timeout is None else f"{max(1, round(timeout * 1000))}ms"
        try:
            r = await self._call(self._kennel.run_command, line, timeout=wire_timeout)
        except kennel.KennelError as e:
            raise ExecTransportError(command=command, cause=e) from e
        if r.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=timeout)
        exit_code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
        return ExecResult(stdout=r.stdout.encode("utf-8"), stderr=r.stderr.encode("utf-8"),
                          exit_code=exit_code)

    # -- files ----------------------------------------------------------------------------

    async def _validate_path_access(self, path: Union[Path, str], *,
                                    for_write: bool = False) -> Path:
        # As the SDK's other remote backends: symlinks are resolved in the sandbox itself.
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    async def read(self, path: Union[Path, str], *,
                   user: Union[str, User, None] = None) -> io.IOBase:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            workspace_path = await self._check_read_with_exec(path, user=user)
        else:
            workspace_path = await self._validate_path_access(path)
        try:
            data = await self._call(self._kennel.read_file, sandbox_path_str(workspace_path))
        except kennel.NotFound as e:
            raise WorkspaceReadNotFoundError(path=error_path, cause=e) from e
        except kennel.KennelError as e:
            raise WorkspaceArchiveReadError(path=error_path, cause=e) from e
        return io.BytesIO(data)

    async def write(self, path: Union[Path, str], data: io.IOBase, *,
                    user: Union[str, User, None] = None) -> None:
        error_path = posix_path_as_path(coerce_posix_path(path))
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = _payload_bytes(data, error_path)
        workspace_path = await self._validate_path_access(path, for_write=True)
        try:
            await self._call(self._kennel.write_file, sandbox_path_str(workspace_path), payload)
        except kennel.KennelError as e:
            raise WorkspaceArchiveWriteError(path=workspace_path, cause=e) from e

    # -- workspace archives ---------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path()
        try:
            raw = await self._call(self._kennel.download_archive, sandbox_path_str(root))
        except kennel.KennelError as e:
            raise WorkspaceArchiveReadError(path=root, cause=e) from e
        skip = self._persist_workspace_skip_relpaths()
        return io.BytesIO(_drop_members(raw, skip) if skip else raw)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        payload = _payload_bytes(data, root)
        try:
            validate_tar_bytes(payload, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(
                path=root, cause=e,
                context={"reason": "unsafe_or_invalid_tar", "member": e.member}) from e
        try:
            await self._call(self._kennel.upload_archive, payload, sandbox_path_str(root))
        except kennel.KennelError as e:
            raise WorkspaceArchiveWriteError(path=root, cause=e) from e


class KennelSandboxClient(BaseSandboxClient[Optional[KennelSandboxClientOptions]]):
    """Makes, resumes and deletes Kennel-backed sandbox sessions.

    ``client`` is a :class:`kennel.Client` (by default one for ``$KENNEL_URL`` and
    ``$KENNEL_TOKEN``, or ``url``/``token``); :meth:`close` closes it only when it was made
    here.
    """

    backend_id = "kennel"
    supports_default_options = True

    def __init__(self, client: Optional[kennel.Client] = None, *, url: Optional[str] = None,
                 token: Optional[str] = None,
                 instrumentation: Optional[Instrumentation] = None,
                 dependencies: Optional[Dependencies] = None):
        self._owns_client = client is None
        self.kennel = client if client is not None else kennel.Client(url, token=token)
        self._instrumentation = (instrumentation if instrumentation is not None
                                 else Instrumentation())
        self._dependencies = dependencies

    def _open(self, options: KennelSandboxClientOptions) -> kennel.Session:
        return self.kennel.session(limits=options.limits, env=options.env,
                                   network=options.network, image=options.image,
                                   idle_ttl=options.idle_ttl)

    async def create(self, *, snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
                     manifest: Optional[Manifest] = None,
                     options: Optional[KennelSandboxClientOptions] = None) -> SandboxSession:
        options = options if options is not None else KennelSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        _check_root(manifest.root)
        kennel_session = await asyncio.to_thread(self._open, options)
        session_id = uuid.uuid4()
        state = KennelSandboxSessionState(
            session_id=session_id, manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            kennel_session_id=kennel_session.id, options=options)
        inner = KennelSandboxSession(state=state, kennel_session=kennel_session)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = getattr(session, "_inner", session)
        if not isinstance(inner, KennelSandboxSession):
            raise TypeError("KennelSandboxClient.delete expects a KennelSandboxSession")
        await inner.shutdown()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Reattaches to the state's Kennel session while it lives; otherwise makes a new one,
        which ``start()`` fills from the state's snapshot."""
        if not isinstance(state, KennelSandboxSessionState):
            raise TypeError("KennelSandboxClient.resume expects a KennelSandboxSessionState")
        state.assert_path_grants_rebound()
        try:
            kennel_session = await asyncio.to_thread(self.kennel.attach, state.kennel_session_id)
            reattached = True
        except (kennel.NotFound, kennel.SessionEnded):
            kennel_session = await asyncio.to_thread(self._open, state.options)
            state.kennel_session_id = kennel_session.id
            state.workspace_root_ready = False
            reattached = False
        inner = KennelSandboxSession(state=state, kennel_session=kennel_session)
        inner._set_start_state_preserved(reattached, system=reattached)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, KennelSandboxSessionState)

    def close(self) -> None:
        if self._owns_client:
            self.kennel.close()


def _check_root(root: str) -> None:
    if not any(root == d or root.startswith(d + "/") for d in _SANDBOX_DIRS):
        raise ValueError(f"a kennel workspace root must be /workspace, /tmp or under them, "
                         f"not {root!r}")


def _payload_bytes(data: io.IOBase, path: Path) -> bytes:
    payload = data.read()
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    if not isinstance(payload, (bytes, bytearray)):
        raise WorkspaceWriteTypeError(path=path, actual_type=type(payload).__name__)
    return bytes(payload)


def _drop_members(raw: bytes, skip: Iterable[Path]) -> bytes:
    """The archive without the SDK's ephemeral paths (they are not part of a snapshot)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as src, \
            tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            if should_skip_tar_member(member.name, skip_rel_paths=skip, root_name=None):
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out.getvalue()
