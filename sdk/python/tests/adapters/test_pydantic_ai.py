"""The pydantic-ai adapter against a live ``kennel serve``: pydantic-ai's own workspace
conformance suite (``pydantic_ai.workspaces.conformance.WorkspaceBackendSuite``), then its agent
loop driven by its FunctionModel and TestModel, calling the workspace tools in a Kennel session."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart,
                                  ToolReturnPart)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.workspaces import (Workspace, WorkspaceOutputLimitError, WorkspaceRef,
                                    WorkspaceTimeoutError, WorkspaceUnavailableError)
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from kennel.adapters.pydantic_ai import KennelWorkspace, KennelWorkspaceBackend

SDK_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def no_session_left(client):
    yield
    assert client.list_sessions() == []


@pytest.mark.usefixtures("no_session_left")
class TestKennelWorkspaceConformance(WorkspaceBackendSuite):
    """Every rule of pydantic-ai's backend contract, the optional reattach and destroy ones too."""

    @pytest.fixture
    def made(self):
        backends: List[KennelWorkspaceBackend] = []
        yield backends
        for backend in backends:
            backend.close()

    @pytest.fixture
    def fresh_backend(self, client, made) -> Callable[[], KennelWorkspaceBackend]:
        def fresh() -> KennelWorkspaceBackend:
            made.append(KennelWorkspaceBackend(client))
            return made[-1]
        return fresh

    @pytest.fixture
    def backend(self, fresh_backend) -> KennelWorkspaceBackend:
        return fresh_backend()

    @pytest.fixture
    def attach_backend(self, client, made) -> Callable[[WorkspaceRef], KennelWorkspaceBackend]:
        def attach(ref: WorkspaceRef) -> KennelWorkspaceBackend:
            made.append(KennelWorkspaceBackend(client, ref=ref))
            return made[-1]
        return attach

    @pytest.fixture
    def destroy_environment(self):
        async def destroy(backend: KennelWorkspaceBackend) -> None:
            await backend.aclose()
        return destroy


@pytest.mark.anyio
async def test_backend_beyond_the_suite(client, no_session_left):
    async with KennelWorkspaceBackend(client, env={"GREETING": "hi there"}) as backend:
        ws = Workspace(backend)
        # A timeout kills the command's process group, and hands back what it printed so far.
        with pytest.raises(WorkspaceTimeoutError) as caught:
            await backend.run('echo $$ > pid; echo "$GREETING"; exec sleep 3600', shell=True, timeout=1)
        assert caught.value.stdout == "hi there\n"
        pid = (await ws.read_text("pid")).strip()
        assert (await backend.run(["sh", "-c", 'kill -0 "$1"', "sh", pid])).exit_code != 0

        # File operations get through while a command runs (a session runs one exec at a time).
        async with anyio.create_task_group() as tg:
            done: List[float] = []

            async def slow() -> None:
                await backend.run(["sleep", "3"])
                done.append(time.monotonic())
            tg.start_soon(slow)
            await anyio.sleep(0.5)
            await ws.write_text("during.txt", "written meanwhile")
            assert await ws.read_text("during.txt") == "written meanwhile"
            wrote_at = time.monotonic()
        assert wrote_at < done[0] - 1

        # Writing a file keeps its mode (Kennel's file API alone would reset it to 0644).
        await ws.write_text("tool.sh", "#!/bin/sh\necho one\n")
        assert (await backend.run(["chmod", "755", "tool.sh"])).exit_code == 0
        await ws.write_text("tool.sh", "#!/bin/sh\necho two\n")
        assert (await backend.run(["./tool.sh"])).stdout == "two\n"

        # Outside /workspace and /tmp (which the file API refuses) the sandbox's own helper reads.
        expected = (await backend.run(["cat", "/etc/os-release"])).stdout
        assert (await ws.read_text("/etc/os-release")) == expected != ""
        assert (await ws.stat("/etc")).is_dir and await ws.exists("/usr/bin/python3")

        # No silent truncation: past 10 MiB of output the command is an error.
        with pytest.raises(WorkspaceOutputLimitError):
            await backend.run(["head", "-c", "11000000", "/dev/zero"])
        assert await ws.list_dir("/tmp/.kennel-pydantic-ai") == ()


def _returns(message: ModelMessage) -> List[ToolReturnPart]:
    return [p for p in message.parts if isinstance(p, ToolReturnPart)] if isinstance(message, ModelRequest) else []


def test_agent_loop_runs_tools_in_the_session_and_continues_in_it(client, no_session_left):
    script = "import sys\nprint(sum(range(10)) * 7)\nsys.exit(3)\n"

    def first_run(messages: List[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = [p for m in messages for p in _returns(m)]
        if not done:
            assert {t.name for t in info.function_tools} == {"run_command", "read_file", "write_file"}
            return ModelResponse(parts=[ToolCallPart("write_file", {"path": "calc.py", "content": script})])
        if len(done) == 1:
            return ModelResponse(parts=[ToolCallPart("run_command", {
                "command": "python3 calc.py | tee answer.txt; s=${PIPESTATUS[0]}; echo oops >&2; exit $s"})])
        if len(done) == 2:
            return ModelResponse(parts=[ToolCallPart("read_file", {"path": "/workspace/answer.txt"})])
        return ModelResponse(parts=[TextPart(json.dumps([p.content for p in done]))])

    workspace = KennelWorkspace(client)
    try:
        result = Agent(FunctionModel(first_run), capabilities=[workspace]).run_sync("compute")
        written, ran, read = json.loads(result.output)
        assert written == {"path": "/workspace/calc.py", "bytes": len(script)}
        assert ran == {"exit_code": 3, "stdout": "315\n", "stderr": "oops\n"}
        assert read == {"content": "315\n"}
        ref = result.workspace.ref
        assert ref is not None and ref.provider == "kennel"
        assert [s.id for s in client.list_sessions()] == [ref.id]
        session = client.attach(ref.id)
        assert session.read_file("/workspace/answer.txt") == b"315\n"
        assert session.read_file("calc.py") == script.encode()
        assert result.all_messages()[-1].workspace_ref == ref

        # The next turn of the conversation attaches to the session named in its history.
        def second_run(messages: List[ModelMessage], info: AgentInfo) -> ModelResponse:
            latest = _returns(messages[-1])
            if not latest:
                return ModelResponse(parts=[ToolCallPart("read_file", {"path": "answer.txt"})])
            return ModelResponse(parts=[TextPart("again: " + latest[0].content["content"])])

        again = Agent(FunctionModel(second_run), capabilities=[workspace]).run_sync(
            "read it again", message_history=result.all_messages())
        assert again.output == "again: 315\n"
        assert again.workspace.ref == ref
        assert len(client.list_sessions()) == 1
    finally:
        workspace.close()


def test_test_model_calls_every_tool(client, no_session_left):
    workspace = KennelWorkspace(client)
    try:
        result = Agent(TestModel(), capabilities=[workspace]).run_sync("go")
        outputs = json.loads(result.output)
        assert set(outputs) == {"run_command", "read_file", "write_file"}
        # TestModel makes up "a" for strings: a command `a` that bash cannot find, a file "a".
        assert outputs["run_command"]["exit_code"] == 127
        assert "a: command not found" in outputs["run_command"]["stderr"]
        assert outputs["write_file"] == {"path": "/workspace/a", "bytes": 1}
        session = client.attach(result.workspace.ref.id)
        assert session.read_file("/workspace/a") == b"a"
    finally:
        workspace.close()


def test_capability_leaves_other_refs_and_a_gone_session_is_unavailable(client, no_session_left):
    workspace = KennelWorkspace(client, tools=False)
    assert workspace.get_toolset() is None
    assert workspace.get_workspace(None, ref=WorkspaceRef(provider="local", id="/tmp")) is None  # type: ignore[arg-type]
    gone = workspace.get_workspace(None, ref=WorkspaceRef(provider="kennel", id="0" * 32))  # type: ignore[arg-type]
    with pytest.raises(WorkspaceUnavailableError):
        anyio.run(gone.working_dir)
    workspace.close()


def test_example_runs_against_the_server(server, no_session_left, run_example):
    lines = run_example("pydantic_ai_example.py").splitlines()
    assert lines[0] == "the sandbox says: primes below 30: [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]"
    assert lines[1].startswith("session: ") and len(lines[1]) == len("session: ") + 32


def test_import_kennel_does_not_import_pydantic_ai():
    code = "import sys, kennel, kennel.adapters; assert 'pydantic_ai' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, PYTHONPATH=str(SDK_DIR)))
