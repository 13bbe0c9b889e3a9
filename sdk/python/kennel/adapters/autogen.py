"""An AutoGen (0.4+) ``CodeExecutor`` that runs code blocks in a Kennel session.

    from autogen_agentchat.agents import CodeExecutorAgent
    from kennel.adapters.autogen import KennelCodeExecutor

    async with KennelCodeExecutor(kennel.AsyncClient(url, token=token)) as executor:
        agent = CodeExecutorAgent("executor", code_executor=executor)
        ...

It stands where autogen's ``DockerCommandLineCodeExecutor`` or ``JupyterCodeExecutor`` would, and
answers as they do: the blocks run in order and stop at the first one that fails; the result's
``exit_code`` is the failing block's (124 for a timeout, 125 when the cancellation token fired,
as ``LocalCommandLineCodeExecutor`` reports them) and ``output`` is what the blocks printed.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple, Union

from autogen_core import CancellationToken, Component
from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult
from pydantic import BaseModel
from typing_extensions import Self

import kennel
from kennel._common import DEFAULT_TIMEOUT
from kennel.results import ExecResult, RichOutput

__all__ = ["KennelCodeExecutor", "KennelCodeExecutorConfig", "KennelCodeResult"]

Mode = Literal["interpreter", "files"]

_PYTHON = ("python", "py", "python3")
_SHELLS = {"bash": "bash", "sh": "sh", "shell": "sh"}

#: How long a cancelled block may take to stop after its interrupt before its exec is cancelled.
INTERRUPT_GRACE_S = 3.0

@dataclass
class KennelCodeResult(CodeResult):
    """A ``CodeResult`` with ``code_file`` as autogen's command-line executors give it (the
    first block's file in the sandbox, if one was written) and the python blocks' rich outputs
    (values, ``display()`` and figures: ``.png``, ``.html``, ``.save(path)``), which
    ``JupyterCodeExecutor`` would have saved as files."""

    code_file: Optional[str] = None
    results: List[RichOutput] = field(default_factory=list)


class KennelCodeExecutorConfig(BaseModel):
    """What ``dump_component()`` keeps: never the token (it comes from ``$KENNEL_TOKEN``)."""

    base_url: Optional[str] = None
    timeout: int = 60
    work_dir: str = "/workspace"
    mode: Mode = "interpreter"
    limits: Optional[Dict[str, Any]] = None
    env: Optional[Dict[str, str]] = None
    network: Any = None
    image: Optional[str] = None
    idle_ttl: Union[float, str, None] = None


class KennelCodeExecutor(CodeExecutor, Component[KennelCodeExecutorConfig]):
    """Runs code blocks (``python``, ``bash``, ``sh``/``shell``) in one Kennel session, opened
    by :meth:`start` (or the first block) and closed by :meth:`stop`; :meth:`restart` swaps it
    for a fresh one, so every variable and file is gone.

    ``mode="interpreter"`` (the default) runs python blocks in the session's persistent
    interpreter and shell blocks in its shell, so state carries over from block to block as in
    ``JupyterCodeExecutor`` (a last expression's value is part of the output).
    ``mode="files"`` saves each block to ``work_dir`` and runs it as a fresh process
    (``python3 file``, ``bash file``), as ``DockerCommandLineCodeExecutor`` does. In both, a
    block whose first line is ``# filename: <path>`` is saved there (under ``work_dir``).

    ``client`` is a :class:`kennel.AsyncClient` (else one is made from ``base_url``/``token``,
    or ``$KENNEL_URL``/``$KENNEL_TOKEN``, and closed by :meth:`stop`); its HTTP timeout must
    exceed ``timeout``, the seconds each block may run. ``limits``, ``env``, ``network``,
    ``image`` and ``idle_ttl`` are the session's, as ``AsyncClient.session`` takes them.
    """

    component_config_schema = KennelCodeExecutorConfig
    component_provider_override = "kennel.adapters.autogen.KennelCodeExecutor"

    def __init__(self, client: Optional[kennel.AsyncClient] = None, *, base_url: Optional[str] = None,
                 token: Optional[str] = None, timeout: int = 60, work_dir: str = "/workspace",
                 mode: Mode = "interpreter", limits: Optional[Mapping[str, Any]] = None,
                 env: Optional[Mapping[str, str]] = None, network: Any = None,
                 image: Optional[str] = None, idle_ttl: Union[float, str, None] = None):
        if timeout < 1:
            raise ValueError("timeout must be at least 1 second")
        if mode not in ("interpreter", "files"):
            raise ValueError(f"mode must be 'interpreter' or 'files', not {mode!r}")
        self._client = client
        self._own_client = client is None
        self._base_url, self._token = base_url, token
        self._timeout = timeout
        self._work_dir = _sandbox_dir(work_dir)
        self._mode: Mode = mode
        self._session_options: Dict[str, Any] = dict(
            limits=dict(limits) if limits else None, env=dict(env) if env else None,
            network=network, image=image, idle_ttl=idle_ttl)
        self._session: Optional[kennel.AsyncSession] = None
        self._lock = asyncio.Lock()

    @property
    def session(self) -> Optional[kennel.AsyncSession]:
        """The open session, to put files in for the code or read what it wrote."""
        return self._session

    @property
    def timeout(self) -> int:
        return self._timeout

    @property
    def work_dir(self) -> str:
        return self._work_dir

    async def start(self) -> None:
        """Opens the session (nothing when one is open)."""
        if self._session is not None:
            return
        if self._client is None:
            self._client = kennel.AsyncClient(self._base_url, token=self._token,
                                              timeout=max(DEFAULT_TIMEOUT, self._timeout + 30))
        session = await self._client.session(**self._session_options)
        try:
            if self._work_dir != "/workspace":
                # Both the shell and the interpreter start there, as a local executor's
                # processes start in its work_dir.
                wd = shlex.quote(self._work_dir)
                await _checked(session.run_code(f"mkdir -p {wd} && cd {wd}", "bash"))
                await _checked(session.run_code(f"import os; os.chdir({self._work_dir!r})"))
        except BaseException:
            await session.close()
            raise
        self._session = session

    async def stop(self) -> None:
        """Closes the session (and the client, when this executor made it)."""
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.close()
        finally:
            if self._own_client and self._client is not None:
                client, self._client = self._client, None
                await client.aclose()

    async def restart(self) -> None:
        """A fresh session in place of the old one: the code's state and files are lost."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        await self.start()

    async def execute_code_blocks(self, code_blocks: List[CodeBlock],
                                  cancellation_token: CancellationToken) -> KennelCodeResult:
        """Runs the blocks in order, stopping at the first that fails, is cancelled or times
        out; the output is what each ran block printed, one after another."""
        async with self._lock:
            await self.start()
            assert self._session is not None
            output: List[str] = []
            results: List[RichOutput] = []
            files: List[str] = []
            exit_code = 0
            for block in code_blocks:
                if cancellation_token.is_cancelled():
                    output.append("\nCancelled")
                    exit_code = 125
                    break
                lang = block.language.lower()
                if lang not in _PYTHON and lang not in _SHELLS:
                    output.append(f"\nunknown language {lang}")
                    exit_code = 1
                    break
                try:
                    path = self._file_for(block.code, lang)
                except ValueError:
                    output.append("Filename is not in the workspace")
                    exit_code = 1
                    break
                if path is not None:
                    await self._session.write_file(path, block.code)
                    files.append(path)
                code, language = self._program(block.code, lang, path)
                r, cancelled = await self._exec(self._session, code, language, cancellation_token)
                output.append(_text_of(r))
                results.extend(r.results)
                exit_code = _exit_code_of(r)
                if cancelled:
                    output.append("\nCancelled")
                    exit_code = 125
                elif r.timed_out:
                    output.append("\nTimeout")
                if exit_code != 0:
                    break
            return KennelCodeResult(exit_code=exit_code, output="".join(output),
                                    code_file=files[0] if files else None, results=results)

    def _file_for(self, code: str, lang: str) -> Optional[str]:
        """Where a block is saved: its ``# filename:`` (ValueError when that leaves
        ``work_dir``), else, in files mode, a name from its hash as autogen's executors make."""
        first = code.split("\n", 1)[0]
        if first.startswith("# filename:"):
            name = first.split(":", 1)[1].strip()
            path = posixpath.normpath(posixpath.join(self._work_dir, name))
            if not path.startswith(self._work_dir.rstrip("/") + "/"):
                raise ValueError(f"{name} is not under {self._work_dir}")
            return path
        if self._mode == "files":
            ext = "py" if lang in _PYTHON else lang
            return posixpath.join(self._work_dir, f"tmp_code_{sha256(code.encode()).hexdigest()}.{ext}")
        return None

    def _program(self, code: str, lang: str, path: Optional[str]) -> Tuple[str, str]:
        """The exec for a block: its code itself in interpreter mode, else a shell line that
        runs its file in a process of its own (python unbuffered, so that its prints come out
        even when it is cut short)."""
        if self._mode == "interpreter":
            return code, "python" if lang in _PYTHON else _SHELLS[lang]
        assert path is not None
        program = "python3 -u" if lang in _PYTHON else _SHELLS[lang]
        return f"cd {shlex.quote(self._work_dir)} && {program} {shlex.quote(path)}", "bash"

    async def _exec(self, session: kennel.AsyncSession, code: str, language: str,
                    token: CancellationToken) -> Tuple[ExecResult, bool]:
        """Runs one exec; when the token fires meanwhile, the code gets ``interrupt()`` (Ctrl-C:
        the session and its state stay) and, should it not stop within ``INTERRUPT_GRACE_S``,
        the exec is cancelled (as its timeout would end it)."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(session.run_code(code, language, timeout=self._timeout))
        cancelled = asyncio.Event()

        def on_cancel() -> None:  # the token may fire from any thread, even after the loop ended
            try:
                loop.call_soon_threadsafe(cancelled.set)
            except RuntimeError:
                pass

        token.add_callback(on_cancel)
        waiter = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result(), False
            await session.interrupt()
            done, _ = await asyncio.wait([task], timeout=INTERRUPT_GRACE_S)
            if not done:
                await session.cancel()
            return await task, True
        finally:
            waiter.cancel()
            if not task.done():  # this coroutine itself was cancelled: drop the exec too
                task.cancel()

    def _to_config(self) -> KennelCodeExecutorConfig:
        base_url = self._client.base_url if self._client is not None else self._base_url
        return KennelCodeExecutorConfig(base_url=base_url, timeout=self._timeout,
                                        work_dir=self._work_dir, mode=self._mode,
                                        **self._session_options)

    @classmethod
    def _from_config(cls, config: KennelCodeExecutorConfig) -> Self:
        return cls(**config.model_dump())


def _sandbox_dir(path: str) -> str:
    """An absolute, normalized directory under /workspace or /tmp, where the server lets
    files be written (relative paths are under /workspace, as the server takes them)."""
    full = posixpath.normpath(posixpath.join("/workspace", path))
    if not any(full == root or full.startswith(root + "/") for root in ("/workspace", "/tmp")):
        raise ValueError(f"work_dir must be under /workspace or /tmp, not {path!r}")
    return full


async def _checked(run: Any) -> None:
    r = await run
    if r.exit_code != 0:
        raise kennel.KennelError(None, "setup_failed", (r.stderr or r.stdout).strip())


def _text_of(r: ExecResult) -> str:
    """stdout, then stderr (a traceback comes last, as in a notebook), then the text of the
    rich outputs (the last expression's value), and a note when output was lost."""
    parts = [r.stdout, r.stderr]
    parts += [o.text + "\n" for o in r.results if o.text]
    if r.stdout_truncated or r.stderr_truncated:
        parts.append("[output truncated]\n")
    if r.interpreter is not None and r.interpreter.crashed:
        parts.append(f"[{r.interpreter.reason or 'the python interpreter crashed'}]\n")
    return "".join(parts)


def _exit_code_of(r: ExecResult) -> int:
    """The block's exit code: 124 for a timeout (as ``timeout(1)`` and autogen say), 128 plus
    the signal for a process a signal ended (as a shell says)."""
    if r.timed_out:
        return 124
    if r.exit_code is not None:
        return r.exit_code
    return 128 + r.signal if r.signal else 1
