"""kennel.adapters.smolagents against a live `kennel serve`: a real smolagents CodeAgent (its own
agent loop, with a scripted model) whose code runs in a Kennel session."""

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, List

import pytest
from rich.console import Console
from smolagents import CodeAgent, tool
from smolagents.default_tools import FinalAnswerTool
from smolagents.memory import ActionStep
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.utils import AgentError, AgentExecutionError

from kennel.adapters.smolagents import KennelExecutor

SDK = Path(__file__).resolve().parents[2]

# A 3x2 RGB PNG made with the standard library only (the sandbox has no PIL), shown through
# `_repr_png_`, as a matplotlib figure or PIL image is shown.
PNG_CODE = '''
import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
class Png:
    def __init__(self, rgb):
        rows = b"".join(b"\\x00" + bytes(rgb) * 3 for _ in range(2))
        head = struct.pack(">IIBBBBB", 3, 2, 8, 2, 0, 0, 0)
        self.data = (b"\\x89PNG\\r\\n\\x1a\\n" + _chunk(b"IHDR", head)
                     + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))
    def _repr_png_(self):
        return self.data
'''


class ScriptedModel(Model):
    """Answers each step with the next scripted output; keeps what it was asked."""

    def __init__(self, outputs: List[str]):
        super().__init__(model_id="scripted")
        self.outputs = list(outputs)
        self.seen: List[str] = []

    def generate(self, messages: List[Any], **kwargs: Any) -> ChatMessage:
        self.seen.append("\n".join(part["text"] for m in messages for part in m.content
                                    if part.get("type") == "text"))
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.outputs.pop(0))


@tool
def where(label: str) -> str:
    """Says where the tool runs.

    Args:
        label: a label to put in front
    """
    import os

    return f"{label}:{os.getcwd()}"


def quiet_logger() -> AgentLogger:
    return AgentLogger(LogLevel.DEBUG, console=Console(file=io.StringIO(), width=200))


def test_code_agent_runs_its_steps_in_kennel(client, server):
    model = ScriptedModel([
        ("Thought: sum the squares, then scale.\n<code>\n"
         "total = sum(i * i for i in range(10))\nprint('total is', total)\n"
         "scaled = total * factor\n</code>"),
        ("Thought: `factor` does not exist; use `base`.\n<code>\n"
         "import os\nprint(where('tool'), os.getpid() != host_pid)\n"
         "open('/workspace/total.txt', 'w').write(str(total))\n"
         "final_answer({'answer': total * 2 + base, 'cwd': os.getcwd()})\n</code>"),
    ])
    executor = KennelExecutor(client=client, logger=quiet_logger())
    agent = CodeAgent(tools=[where], model=model, executor=executor, max_steps=4,
                      verbosity_level=LogLevel.OFF)
    try:
        answer = agent.run("compute", additional_args={"base": 7, "host_pid": os.getpid()})
        assert answer == {"answer": 285 * 2 + 7, "cwd": "/workspace"}
        assert executor.session.read_file("/workspace/total.txt") == b"285"

        steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
        assert len(steps) == 2
        assert isinstance(steps[0].error, AgentExecutionError)
        assert steps[0].error.message.startswith("total is 285\n")
        assert "NameError" in steps[0].error.message
        assert "name 'factor' is not defined" in steps[0].error.message
        assert "name 'factor' is not defined" in model.seen[1]  # the model was shown the error
        assert steps[1].error is None and steps[1].is_final_answer
        assert steps[1].observations.startswith("Execution logs:\ntool:/workspace True\n")

        # A second run in the same sandbox: the state and the tools are still there.
        model.outputs.append("<code>\nfinal_answer(total + base)\n</code>")
        assert agent.run("again", reset=False) == 292
    finally:
        agent.cleanup()
    assert executor.session is None
    assert client.list_sessions() == []


def test_executor_logs_state_errors_and_final_answer(client):
    logger = quiet_logger()
    with KennelExecutor(client=client, logger=logger) as ex:
        ex.send_tools({"final_answer": FinalAnswerTool()})
        ex.send_variables({"start": 6, "names": ["a", "b"]})

        out = ex("x = start * 7\nprint('x is', x)\nprint(names)")
        assert (out.output, out.logs, out.is_final_answer) == (None, "x is 42\n['a', 'b']\n", False)
        out = ex("x + 1")
        assert (out.output, out.logs, out.is_final_answer) == ("43", "", False)

        with pytest.raises(AgentError) as e:
            ex("print('before'); y = x // 0")
        msg = e.value.message
        assert msg.startswith("before\n\nExecuting code yielded an error:\nZeroDivisionError\n")
        assert "integer division or modulo by zero" in msg and "Traceback" in msg

        with pytest.raises(AgentError, match="exited with 3"):
            ex("import sys; sys.exit(3)")

        ex.timeout = 1
        with pytest.raises(AgentError, match="timed out"):
            ex("import time; z = 1; time.sleep(30)")
        ex.timeout = None

        out = ex("print('done'); final_answer({'x': x, 'z': z, 'pair': (1, 2)})")
        assert out.is_final_answer and out.logs == "done\n"
        assert out.output == {"x": 42, "z": 1, "pair": (1, 2)}
        with pytest.raises(AgentError, match="final answer could not be read back"):
            ex("final_answer('x' * 200_000)")  # over what kennel returns of an exception

        # A crash loses the interpreter's state; the tools and variables are sent again.
        with pytest.raises(AgentError, match="interpreter crashed.*tools and variables were sent"):
            ex("import os; os._exit(9)")
        with pytest.raises(AgentError, match="name 'x' is not defined"):
            ex("x")
        out = ex("final_answer(names + [start])")
        assert out.is_final_answer and out.output == ["a", "b", 6]
        session_id = ex.session.id
        assert [s.id for s in client.list_sessions()] == [session_id]
    assert client.list_sessions() == []
    with pytest.raises(AgentError, match="session is closed"):
        ex("1")
    ex.cleanup()  # twice does nothing


def test_executor_returns_images_as_pil(client):
    with KennelExecutor(client=client, logger=quiet_logger()) as ex:
        ex(PNG_CODE)
        shown = ex("display(Png((255, 0, 0)))\nprint('shown')").output
        assert shown.format == "PNG" and shown.size == (3, 2)
        assert shown.convert("RGB").getpixel((2, 1)) == (255, 0, 0)
        two = ex("display(Png((1, 2, 3)))\ndisplay(Png((4, 5, 6)))").output
        assert [im.convert("RGB").getpixel((0, 0)) for im in two] == [(1, 2, 3), (4, 5, 6)]
        value = ex("display(Png((9, 9, 9)))\nPng((0, 0, 255))").output  # the value wins
        assert value.convert("RGB").getpixel((0, 0)) == (0, 0, 255)
    assert client.list_sessions() == []


def test_missing_packages_are_logged_not_fatal(client):
    out = io.StringIO()
    logger = AgentLogger(LogLevel.INFO, console=Console(file=out, width=200))
    with KennelExecutor(["surely-not-a-package-kennel"], logger, client=client) as ex:
        assert ex.installed_packages == []
        assert ex("print(6 * 7)").logs == "42\n"
    assert "could not install surely-not-a-package-kennel" in out.getvalue()
    assert client.list_sessions() == []


def wheel(name: str, code: str) -> bytes:
    """A minimal wheel of one module, so that pip installs without network."""
    info = f"{name}-1.0.dist-info"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{name}.py", code)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{name}.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return buf.getvalue()


def test_installed_packages_survive_a_crash(client):
    with KennelExecutor(client=client, logger=quiet_logger()) as ex:
        path = "/workspace/kennel_probe-1.0-py3-none-any.whl"
        ex.session.write_file(path, wheel("kennel_probe", "VALUE = 6 * 7\n"))
        assert ex.install_packages([path]) == [path]
        assert ex("import kennel_probe\nkennel_probe.VALUE").output == "42"
        with pytest.raises(AgentError, match="interpreter crashed"):
            ex("import os; os._exit(1)")
        assert ex("import kennel_probe\nkennel_probe.__file__").output == (
            "'/tmp/kennel-packages/kennel_probe.py'")
    assert client.list_sessions() == []


def test_import_kennel_does_not_import_smolagents():
    code = "import kennel, sys; assert 'smolagents' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=SDK,
                   env=dict(os.environ, PYTHONPATH=str(SDK)))


def test_example(server, client, run_example):
    assert run_example("smolagents_example.py").splitlines() == [
        "step 1 error: 'sum of squares: 285' ... \"NameError: name 'count' is not defined\"",
        "step 2 logs: ['running in /workspace', 'Last output from code snippet:', '28.5']",
        "answer: 28.5",
    ]
    assert client.list_sessions() == []
