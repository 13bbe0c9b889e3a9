"""A LangChain Deep Agents sandbox backend that runs the agent's commands in a Kennel session.

    from deepagents import create_deep_agent
    from kennel.adapters.langchain import KennelSandbox

    with KennelSandbox(kennel.Client(url, token=token)) as sandbox:   # close() on exit
        agent = create_deep_agent(model=model, backend=sandbox)
        agent.invoke({"messages": [{"role": "user", "content": "..."}]})

It is a deepagents ``BaseSandbox``: ``execute`` runs a command in the session's bash (``cd`` and
``export`` persist between commands), and deepagents builds the agent's ``ls``, ``read_file``,
``write_file``, ``edit_file``, ``glob`` and ``grep`` tools on it and on ``upload_files``. Files
move through Kennel's files API (an archive when many go to one directory); paths outside
/workspace and /tmp, which that API does not serve, and symlinks, which it does not follow, go
through the session's shell instead, so the file tools see the same filesystem as ``execute``.

The sandbox's root is read-only, so deepagents' own artifacts (large tool results, summarized
history), which it keeps under ``/`` by default, need a writable root:
``create_deep_agent(..., backend=CompositeBackend(sandbox, {}, artifacts_root="/workspace"))``.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import uuid
from pathlib import PurePosixPath
from typing import Any, Dict, List, Optional, Tuple, Union

from deepagents.backends.protocol import (FILE_NOT_FOUND, INVALID_PATH, IS_DIRECTORY,
                                          PERMISSION_DENIED, ExecuteResponse,
                                          FileDownloadResponse, FileUploadResponse)
from deepagents.backends.sandbox import BaseSandbox

import kennel

__all__ = ["KennelSandbox"]

#: The directories Kennel's files API serves; other paths go through the shell.
ROOTS = ("/workspace", "/tmp")

#: From this many files for one root on, ``upload_files`` sends them as one archive.
ARCHIVE_MIN_FILES = 4

#: The exit code ``execute`` reports for a command that ran out of time, as ``timeout(1)`` does.
TIMEOUT_EXIT_CODE = 124


class KennelSandbox(BaseSandbox):
    """A deepagents sandbox backend on one Kennel session.

    ``target`` is a :class:`kennel.Client`, from which a session is opened (with ``limits``,
    ``env``, ``network``, ``image`` and ``idle_ttl``, as ``Client.session`` takes them) and ended
    by :meth:`close`; or an existing :class:`kennel.Session`, which stays its owner's to end.
    ``timeout`` (seconds) bounds a command when the agent gives none; unset, the session's own
    limit does. The session is :attr:`session`.
    """

    def __init__(self, target: Union[kennel.Client, kennel.Session], *,
                 timeout: Optional[int] = None, **session_options: Any):
        if isinstance(target, kennel.Session):
            if session_options:
                raise TypeError("session options need a kennel.Client, not an open session")
            self.session, self._owned = target, False
        elif isinstance(target, kennel.Client):
            self.session, self._owned = target.session(**session_options), True
        else:
            raise TypeError(f"expected a kennel.Client or kennel.Session, got {type(target).__name__}")
        self._timeout = timeout

    @property
    def id(self) -> str:
        return self.session.id

    def close(self) -> None:
        """Ends the session if this backend opened it."""
        if self._owned:
            self.session.close()

    def __enter__(self) -> "KennelSandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<KennelSandbox {self.session.id}>"

    # -- commands -----------------------------------------------------------------------------

    def execute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:
        """Runs ``command`` in the session's bash with stderr merged into stdout, so the
        output keeps the order it was written in. A timeout of 0 (no limit) means the session's
        own limit, as Kennel bounds every command."""
        if not command.strip():
            return ExecuteResponse(output="error: empty command", exit_code=1)
        limit = timeout or self._timeout or None
        # Braces, not a subshell: `cd` and `export` still outlive the command.
        r = self.session.run_command("{ " + command + "\n} 2>&1", timeout=limit)
        output, exit_code = r.stdout + r.stderr, r.exit_code
        if r.timed_out:
            exit_code = TIMEOUT_EXIT_CODE
            note = "error: the command timed out" + (f" after {limit}s" if limit else "")
            output += note if not output or output.endswith("\n") else "\n" + note
        elif exit_code is None and r.signal is not None:
            exit_code = 128 + r.signal  # as a shell reports a killed child
        return ExecuteResponse(output=output, exit_code=exit_code,
                               truncated=r.stdout_truncated or r.stderr_truncated)

    # -- files --------------------------------------------------------------------------------

    def upload_files(self, files: List[Tuple[str, bytes]]) -> List[FileUploadResponse]:
        errors = [_path_error(path) for path, _ in files]
        batches: Dict[str, List[int]] = {}
        for i, (path, _) in enumerate(files):
            root = _root_of(path) if errors[i] is None else None
            if root is not None:
                batches.setdefault(root, []).append(i)
        sent = set()
        for root, indexes in batches.items():
            if len(indexes) >= ARCHIVE_MIN_FILES and self._upload_archive(
                    root, [files[i] for i in indexes]):
                sent.update(indexes)
        for i, (path, data) in enumerate(files):
            if errors[i] is None and i not in sent:
                try:
                    errors[i] = self._upload_one(path, bytes(data))
                except kennel.KennelError as e:  # an ended session, say: one answer per file
                    errors[i] = _file_error(e)
        return [FileUploadResponse(path=path, error=error)
                for (path, _), error in zip(files, errors)]

    def download_files(self, paths: List[str]) -> List[FileDownloadResponse]:
        out = []
        for path in paths:
            error = _path_error(path)
            data = None
            if error is None:
                try:
                    data, error = self._download_one(path)
                except kennel.KennelError as e:
                    error = _file_error(e)
            out.append(FileDownloadResponse(path=path, content=data, error=error))
        return out

    def _upload_archive(self, root: str, files: List[Tuple[str, bytes]]) -> bool:
        """One request for many files; False (nothing to report) when Kennel refuses the
        archive, so that each file is sent alone and gets its own error."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, data in files:
                member = tarfile.TarInfo(_normal(path)[len(root) + 1:])
                member.size, member.mode = len(data), 0o644
                tar.addfile(member, io.BytesIO(bytes(data)))
        try:
            self.session.upload_archive(buf.getvalue(), root)
        except kennel.KennelError:
            return False
        return True

    def _upload_one(self, path: str, data: bytes) -> Optional[str]:
        if _root_of(path) is not None:
            try:
                self.session.write_file(_normal(path), data)
                return None
            except kennel.KennelError as e:
                if "ELOOP" not in e.message:
                    return _file_error(e)
        # Staged in /tmp, then copied by the sandbox's own shell (which follows symlinks).
        staged = _staging_path()
        try:
            self.session.write_file(staged, data)
        except kennel.KennelError as e:
            return _file_error(e)
        q, s = shlex.quote(path), shlex.quote(staged)
        r = self.session.run_command(
            f"{{ mkdir -p -- \"$(dirname -- {q})\" && cp -- {s} {q}; }} 2>&1; "
            f"rc=$?; rm -f -- {s}; exit $rc", timeout=self._timeout)
        return None if r.exit_code == 0 else _shell_error(r.stdout + r.stderr)

    def _download_one(self, path: str) -> Tuple[Optional[bytes], Optional[str]]:
        if _root_of(path) is not None:
            try:
                return self.session.read_file(_normal(path)), None
            except kennel.KennelError as e:
                if "ELOOP" not in e.message:
                    return None, _file_error(e)
        staged, q = _staging_path(), shlex.quote(path)
        r = self.session.run_command(
            f"test -e {q} || exit 2; test -d {q} && exit 3; cp -- {q} {shlex.quote(staged)} 2>&1",
            timeout=self._timeout)
        if r.exit_code != 0:
            return None, {2: FILE_NOT_FOUND, 3: IS_DIRECTORY}.get(
                r.exit_code or 0, _shell_error(r.stdout + r.stderr))
        try:
            return self.session.read_file(staged), None
        except kennel.KennelError as e:
            return None, _file_error(e)
        finally:
            try:
                self.session.delete_file(staged)
            except kennel.KennelError:
                pass


def _path_error(path: Any) -> Optional[str]:
    """deepagents passes absolute paths; a relative one, a NUL or a ``..`` is refused, as
    its own filesystem backend refuses them."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        return INVALID_PATH
    return INVALID_PATH if ".." in PurePosixPath(path).parts else None


def _normal(path: str) -> str:
    return str(PurePosixPath(path))  # no "//" or "/./"


def _root_of(path: str) -> Optional[str]:
    p = _normal(path)
    return next((root for root in ROOTS if p.startswith(root + "/")), None)


def _staging_path() -> str:
    return f"/tmp/.kennel-transfer-{uuid.uuid4().hex}"


def _file_error(e: kennel.KennelError) -> str:
    """The deepagents error code for a files API error, else Kennel's own message."""
    if isinstance(e, kennel.NotFound) and "no such file" in e.message:
        return FILE_NOT_FOUND  # not a 404 for the session itself, which is not the file's
    for marker, code in (("EISDIR", IS_DIRECTORY), ("ENOTDIR", INVALID_PATH),
                         ("ELOOP", INVALID_PATH), ("EACCES", PERMISSION_DENIED),
                         ("EPERM", PERMISSION_DENIED), ("EROFS", PERMISSION_DENIED),
                         ("must be a file path", INVALID_PATH)):
        if marker in e.message:
            return code
    return f"{e.code}: {e.message}"


def _shell_error(output: str) -> str:
    """The deepagents error code for what cp/mkdir printed, else that text."""
    for marker, code in (("Read-only file system", PERMISSION_DENIED),
                         ("Permission denied", PERMISSION_DENIED),
                         ("Is a directory", IS_DIRECTORY), ("Not a directory", INVALID_PATH),
                         ("No such file", FILE_NOT_FOUND)):
        if marker in output:
            return code
    return output.strip() or "the copy failed"
