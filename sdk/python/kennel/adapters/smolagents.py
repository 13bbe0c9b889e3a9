"""A smolagents ``CodeAgent`` executor that runs the agent's code in a Kennel session.

    import kennel
    from smolagents import CodeAgent
    from kennel.adapters.smolagents import KennelExecutor

    executor = KennelExecutor(client=kennel.Client(url, token=token))
    with CodeAgent(tools=[], model=model, executor=executor) as agent:   # cleanup() on exit
        agent.run("...")

It is a smolagents ``RemotePythonExecutor``, as its E2B and Docker executors are: the session's
persistent interpreter keeps variables between steps, the agent's tools (``final_answer`` among
them) are sent into it as code, and ``final_answer(...)`` ends the run by raising
``FinalAnswerException`` there, whose serialized value comes back as the answer. If the
interpreter crashes, the tools and variables are sent again to the fresh one.
"""

from __future__ import annotations

import base64
import io
import re
import shlex
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Union

import PIL.Image
from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.serialization import SerializationError
from smolagents.tools import Tool, get_tools_definition_code
from smolagents.utils import AgentError

import kennel

__all__ = ["KennelExecutor"]

#: Where ``install_packages`` puts packages (the sandbox's system site-packages is read-only).
PACKAGES_DIR = "/tmp/kennel-packages"

# Puts the packages install_packages installed on the interpreter's path.
_SYS_PATH = (f"import importlib as _il, sys as _sys\n"
             f"if {PACKAGES_DIR!r} not in _sys.path: _sys.path.insert(0, {PACKAGES_DIR!r})\n"
             f"_il.invalidate_caches()\n")

# The order smolagents' E2BExecutor picks a result's format in, as MIME types.
_TEXT_MIMES = ("text/html", "application/json", "text/latex", "text/markdown", "image/svg+xml",
               "text/plain")


class KennelExecutor(RemotePythonExecutor):
    """Runs a ``CodeAgent``'s code in one Kennel session, opened here and closed by
    :meth:`cleanup` (which ``CodeAgent.cleanup()`` and ``with CodeAgent(...)`` call).

    ``additional_imports`` are pip-installed into the sandbox when given (that needs a session
    with network access to PyPI; failures are logged, as smolagents' Blaxel executor does).
    ``logger`` defaults to a smolagents ``AgentLogger``. ``client`` is a :class:`kennel.Client`
    (else one is made from ``base_url``/``token``, or ``$KENNEL_URL``/``$KENNEL_TOKEN``, and
    closed by :meth:`cleanup`); ``timeout`` bounds each step's code; ``limits``, ``env``,
    ``network``, ``image`` and ``idle_ttl`` are the session's, as ``Client.session`` takes them.
    The session is :attr:`session`, to upload files for the agent or read what it wrote.
    """

    def __init__(self, additional_imports: Sequence[str] = (),
                 logger: Optional[AgentLogger] = None, allow_pickle: bool = False, *,
                 client: Optional[kennel.Client] = None, base_url: Optional[str] = None,
                 token: Optional[str] = None, timeout: Union[float, str, None] = None,
                 limits: Optional[Mapping[str, Any]] = None,
                 env: Optional[Mapping[str, str]] = None, network: Any = None,
                 image: Optional[str] = None, idle_ttl: Union[float, str, None] = None):
        super().__init__(list(additional_imports), logger or AgentLogger(LogLevel.INFO),
                         allow_pickle=allow_pickle)
        self._own_client = client is None
        self.client = client or kennel.Client(base_url, token=token)
        self.timeout = timeout
        self.session: Optional[kennel.Session] = None
        self._tools: Dict[str, Tool] = {}
        self._variables: Dict[str, Any] = {}
        self._restoring = False
        self._packages_on_path = False
        try:
            self.session = self.client.session(limits=limits, env=env, network=network,
                                               image=image, idle_ttl=idle_ttl)
            self.installed_packages = self.install_packages(list(additional_imports))
        except BaseException:
            self.cleanup()
            raise
        self.logger.log(f"kennel session {self.session.id} is running", level=LogLevel.INFO)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Runs code in the session: an exception there raises ``AgentError`` (which the agent
        shows the model as the step's error), ``FinalAnswerException`` ends the run."""
        if self.session is None or self.session.closed:
            raise AgentError("the kennel session is closed", self.logger)
        r = self.session.run_code(code, timeout=self.timeout)
        if r.interpreter is not None and r.interpreter.restarted and not self._restoring:
            self._restore()
        logs = r.stdout + ("\n[output truncated]\n" if r.stdout_truncated else "")
        if r.error is not None and r.error.name == self.FINAL_ANSWER_EXCEPTION:
            try:
                answer = self._deserialize_final_answer(r.error.value, self.allow_pickle)
            except (ValueError, SerializationError) as e:
                raise AgentError(f"the final answer could not be read back (kennel returns an "
                                 f"exception's value up to about 100 KB): {e}", self.logger) from e
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        failure = _failure(r)
        if failure:
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{failure}", self.logger)
        return CodeOutput(output=_output(r.results), logs=logs, is_final_answer=False)

    def send_tools(self, tools: Dict[str, Tool]) -> None:
        """As smolagents' own, except that the modules ``final_answer`` imports (the patched one
        imports numpy and PIL to serialize values it may meet) are optional and not installed:
        Kennel's python has no third-party packages, and smolagents' sandboxes would
        pip-install them. The other tools' packages are installed when the sandbox lacks them."""
        self._tools = dict(tools)
        wanted = _requirements(t for n, t in tools.items() if n != "final_answer")
        optional: Set[str] = set()
        final = tools.get("final_answer")
        if final is not None:
            if "_forward" not in vars(type(final)):  # a second patch breaks it (NameError)
                self._patch_final_answer_with_exception(final)
            optional = _requirements([final]) - wanted
        missing = self._missing_modules(sorted(wanted - {"smolagents", *self.installed_packages}))
        if missing:
            self.installed_packages += self.install_packages(
                ["pillow" if m == "PIL" else m for m in missing])
        code = get_tools_definition_code(tools)
        if code:
            for module in optional:
                code = re.sub(rf"(?m)^import {re.escape(module)}$",
                              f"try:\n    import {module}\nexcept ImportError:\n    pass", code)
            logs = self.run_code_raise_errors(code).logs
            if logs:
                self.logger.log(logs)

    def send_variables(self, variables: Dict[str, Any]) -> None:
        self._variables = dict(variables)
        super().send_variables(variables)

    def _restore(self) -> None:
        """Gives a fresh interpreter (after a crash) the tools, variables and packages the
        agent sent, so that ``final_answer`` still works."""
        self._restoring = True
        try:
            if self._packages_on_path:
                self.run_code_raise_errors(_SYS_PATH)
            if self._variables:
                super().send_variables(self._variables)
            if self._tools:
                self.send_tools(self._tools)
        finally:
            self._restoring = False

    def _missing_modules(self, modules: List[str]) -> List[str]:
        if not modules:
            return []
        r = self.run_code_raise_errors(
            f"import importlib.util as _u\n[m for m in {modules!r} if _u.find_spec(m) is None]")
        return [m for m in modules if repr(m) in str(r.output)]

    def install_packages(self, additional_imports: List[str]) -> List[str]:
        """Installs packages with pip into :data:`PACKAGES_DIR`, put on the interpreter's
        ``sys.path``; returns those installed (none when pip fails, which is logged)."""
        if not additional_imports:
            return []
        assert self.session is not None
        pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir",
               "--retries", "1", "--target", PACKAGES_DIR, *additional_imports]
        r = self.session.run_code(
            "import subprocess as _sp, sys as _sys\n"
            f"_r = _sp.run([_sys.executable, *{pip!r}], capture_output=True, text=True)\n"
            f"{_SYS_PATH}"
            "print(_r.stdout + _r.stderr, end='')\n"
            "if _r.returncode: raise RuntimeError(f'pip exited {_r.returncode}')\n",
            timeout=self.timeout)
        if r.error is not None or not r.ok:
            self.logger.log_error(f"could not install {shlex.join(additional_imports)}: "
                                  f"{r.stdout.strip() or _failure(r)}")
            return []
        self._packages_on_path = True
        self.logger.log(f"installed {shlex.join(additional_imports)}", level=LogLevel.INFO)
        return list(additional_imports)

    def cleanup(self) -> None:
        """Closes the session (and the client, when this executor made it); safe to repeat."""
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close()
        finally:
            if self._own_client:
                self.client.close()

    def delete(self) -> None:
        self.cleanup()

    def __enter__(self) -> "KennelExecutor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


def _requirements(tools: Any) -> Set[str]:
    return {pkg for tool in tools for pkg in tool.to_dict()["requirements"]}


def _failure(r: kennel.ExecResult) -> str:
    """Why an exec failed, for the model to read; empty when it did not."""
    if r.timed_out:
        return "the code timed out (the interpreter was interrupted; its state is kept)"
    if r.interpreter is not None and r.interpreter.crashed:
        return (f"the python interpreter crashed: {r.interpreter.reason or 'no reason given'}; "
                f"the agent's tools and variables were sent to the new one\n{r.stderr}")
    if r.error is not None:
        return "\n".join([r.error.name, r.error.value, *r.error.traceback])
    if r.exit_code != 0:
        how = f"signal {r.signal}" if r.signal is not None else r.exit_code
        return f"the code exited with {how}\n{r.stderr}"
    return ""


def _output(results: List[kennel.RichOutput]) -> Any:
    """The step's output as smolagents' E2B executor gives it: the last expression's value,
    an image as a ``PIL.Image``; with no value, what the code displayed (figures), if any."""
    value = next((o for o in results if o.kind == "value"), None)
    if value is not None:
        return _convert(value)
    shown = [_convert(o) for o in results if o.png is not None or o.jpeg is not None]
    return shown[0] if len(shown) == 1 else shown or None


def _convert(o: kennel.RichOutput) -> Any:
    for mime in ("image/jpeg", "image/png"):
        if isinstance(o.data.get(mime), str):
            return PIL.Image.open(io.BytesIO(base64.b64decode(o.data[mime])))
    return next((o.data[m] for m in _TEXT_MIMES if m in o.data), None)
