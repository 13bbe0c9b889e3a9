"""kennel.adapters.autogen against a live `kennel serve`, driven by autogen's own agents
(CodeExecutorAgent, AssistantAgent with PythonCodeExecutionTool) and its scripted model,
ReplayChatCompletionClient, as well as through the CodeExecutor protocol directly."""

import asyncio
import hashlib
import json
import time
from typing import Any, Awaitable, Callable

import pytest
from autogen_agentchat.agents import AssistantAgent, CodeExecutorAgent
from autogen_agentchat.messages import CodeExecutionEvent, ToolCallSummaryMessage
from autogen_core import CancellationToken, FunctionCall
from autogen_core.code_executor import CodeBlock, CodeExecutor
from autogen_core.models import CreateResult, ModelFamily, RequestUsage, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient
from autogen_ext.tools.code_execution import PythonCodeExecutionTool

import kennel
from kennel.adapters.autogen import KennelCodeExecutor, KennelCodeResult


pytestmark = pytest.mark.filterwarnings("ignore:No approval function set")


@pytest.fixture(autouse=True)
def no_session_left(client):
    yield
    assert client.list_sessions() == []


def run(server, body: Callable[[KennelCodeExecutor], Awaitable[Any]], **options: Any) -> Any:
    """Runs ``body`` with a started executor on the fixture server, stopped afterwards."""
    async def main() -> Any:
        async with kennel.AsyncClient(server.url, token=server.token, timeout=60) as c:
            async with KennelCodeExecutor(c, **options) as executor:
                return await body(executor)
    return asyncio.run(main())


def py(code: str) -> CodeBlock:
    return CodeBlock(code=code, language="python")


def sh(code: str, language: str = "bash") -> CodeBlock:
    return CodeBlock(code=code, language=language)


async def execute(executor: KennelCodeExecutor, *blocks: CodeBlock) -> KennelCodeResult:
    return await executor.execute_code_blocks(list(blocks), CancellationToken())


def tool_call(call_id: str, code: str) -> CreateResult:
    return CreateResult(finish_reason="function_calls", cached=False,
                        usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                        content=[FunctionCall(id=call_id, name="CodeExecutor",
                                              arguments=json.dumps({"code": code}))])


# -- through autogen's agents ------------------------------------------------------------


def test_code_executor_agent_runs_markdown_blocks(server, client):
    digest = hashlib.sha256(b"kennel").hexdigest()
    task = ("Here you go:\n"
            "```python\n"
            "import hashlib\n"
            "digest = hashlib.sha256(b'kennel').hexdigest()\n"
            "open('digest.txt', 'w').write(digest)\n"
            "print(digest[:12])\n"
            "```\n"
            "and\n"
            "```sh\n"
            "wc -c < digest.txt\n"
            "```\n")

    async def body(executor):
        assert isinstance(executor, CodeExecutor)
        agent = CodeExecutorAgent("executor", code_executor=executor)
        result = await agent.run(task=task)
        written = client.attach(executor.session.id).read_file("digest.txt")
        return result.messages[-1], written

    message, written = run(server, body)
    assert message.source == "executor"
    assert message.content == f"{digest[:12]}\n64\n"
    assert written == digest.encode()


def test_code_executor_agent_with_a_scripted_model(server):
    model = ReplayChatCompletionClient([
        "```python\nimport os\nprint(os.getcwd(), sum(i * i for i in range(100)))\n```",
        "The sum is 328350.",
    ])

    async def body(executor):
        agent = CodeExecutorAgent("coder", code_executor=executor, model_client=model)
        return [event async for event in agent.run_stream(task="sum the squares below 100")]

    events = run(server, body)
    [execution] = [e for e in events if isinstance(e, CodeExecutionEvent)]
    assert execution.result.exit_code == 0
    assert execution.result.output == "/workspace 328350\n"
    # The model's second call (its reflection) saw what the sandbox printed.
    last = model.create_calls[1]["messages"][-1]
    assert isinstance(last, UserMessage) and last.content == "/workspace 328350\n"
    assert events[-1].messages[-1].content == "The sum is 328350."


def test_assistant_agent_with_python_code_execution_tool(server):
    model = ReplayChatCompletionClient(
        [tool_call("1", "n = sum(range(10))\nprint(n)"), tool_call("2", "print(n * 2)\nn + 1")],
        model_info={"vision": False, "function_calling": True, "json_output": False,
                    "family": ModelFamily.UNKNOWN, "structured_output": False})

    async def body(executor):
        agent = AssistantAgent("assistant", model, tools=[PythonCodeExecutionTool(executor)])
        first = await agent.run(task="sum 0..9")
        second = await agent.run(task="double it")  # the interpreter kept n
        return first.messages[-1], second.messages[-1]

    first, second = run(server, body)
    assert isinstance(first, ToolCallSummaryMessage) and first.content == "45\n"
    assert isinstance(second, ToolCallSummaryMessage) and second.content == "90\n46\n"


# -- the CodeExecutor protocol -----------------------------------------------------------


def test_python_and_shell_blocks(server):
    async def body(executor):
        return await execute(executor, py("x = 6 * 7\nprint('x is', x)\nx"),
                             sh("mkdir -p sub && cd sub && export GREETING=hello && pwd"),
                             sh("echo $GREETING from $(pwd)", "sh"),
                             py("print(x + 1)"))

    r = run(server, body)
    assert r.exit_code == 0
    # The shell keeps its directory and exports from block to block, as a terminal does.
    assert r.output == "x is 42\n42\n/workspace/sub\nhello from /workspace/sub\n43\n"
    assert [o.text for o in r.results] == ["42"]
    assert r.code_file is None


def test_failing_block_stops_the_rest(server, client):
    async def body(executor):
        shell_fail = await execute(executor, py("print('one')"), sh("echo two; exit 3"),
                                   py("open('never.txt', 'w').write('ran')"))
        py_fail = await execute(executor, py("print('before')\n1 / 0"), sh("touch never2.txt"))
        listing = {e.name for e in await executor.session.list_files()}
        return shell_fail, py_fail, listing

    shell_fail, py_fail, listing = run(server, body)
    assert (shell_fail.exit_code, shell_fail.output) == (3, "one\ntwo\n")
    assert py_fail.exit_code == 1
    assert py_fail.output.startswith("before\nTraceback (most recent call last):\n")
    assert py_fail.output.endswith("ZeroDivisionError: division by zero\n")
    assert "never.txt" not in listing and "never2.txt" not in listing


def test_files_mode_runs_each_block_as_a_file(server):
    async def body(executor):
        r = await execute(executor, py("# filename: tools/calc.py\nx = 7\nprint(x * 6)"),
                          sh("python3 tools/calc.py; ls tools"))
        fresh = await execute(executor, py("print(x)"))
        saved = await executor.session.read_file("tools/calc.py")
        return r, fresh, saved

    r, fresh, saved = run(server, body, mode="files")
    assert (r.exit_code, r.output) == (0, "42\n42\ncalc.py\n")
    assert r.code_file == "/workspace/tools/calc.py"
    assert saved == b"# filename: tools/calc.py\nx = 7\nprint(x * 6)"
    # Each block is a process of its own, as in autogen's command-line executors.
    assert fresh.exit_code == 1 and fresh.output.endswith("NameError: name 'x' is not defined\n")
    digest = hashlib.sha256(b"print(x)").hexdigest()
    assert fresh.code_file == f"/workspace/tmp_code_{digest}.py"


def test_work_dir_unknown_language_and_filename_outside(server):
    async def body(executor):
        where = await execute(executor, py("import os; print(os.getcwd())"), sh("pwd"),
                              py("# filename: a.py\nprint('named')"))
        unknown = await execute(executor, CodeBlock(code="puts 1", language="ruby"))
        outside = await execute(executor, py("# filename: ../../etc/x.py\nprint(1)"))
        return where, unknown, outside

    where, unknown, outside = run(server, body, work_dir="/tmp/project")
    assert (where.exit_code, where.output) == (0, "/tmp/project\n/tmp/project\nnamed\n")
    assert where.code_file == "/tmp/project/a.py"
    assert (unknown.exit_code, unknown.output) == (1, "\nunknown language ruby")
    assert (outside.exit_code, outside.output) == (1, "Filename is not in the workspace")


def test_timeout(server):
    async def body(executor):
        r = await execute(executor, py("import time\nprint('start', flush=True)\ntime.sleep(30)"),
                          py("print('never')"))
        after = await execute(executor, py("print('still here')"))
        return r, after

    started = time.monotonic()
    r, after = run(server, body, timeout=1)
    assert time.monotonic() - started < 15
    assert r.exit_code == 124
    assert r.output.startswith("start\n") and r.output.endswith("KeyboardInterrupt\n\nTimeout")
    assert "never" not in r.output
    assert (after.exit_code, after.output) == (0, "still here\n")


@pytest.mark.parametrize("mode", ["interpreter", "files"])
def test_cancellation_interrupts_a_long_block(server, mode):
    async def body(executor):
        await execute(executor, py("# filename: state.py\nkept = 'kept'"))
        token = CancellationToken()
        asyncio.get_running_loop().call_later(1.0, token.cancel)
        started = time.monotonic()
        r = await executor.execute_code_blocks(
            [py("import time\nprint('started', flush=True)\ntime.sleep(60)\nprint('finished')"),
             py("print('never')")], token)
        took = time.monotonic() - started
        shell = CancellationToken()
        asyncio.get_running_loop().call_later(1.0, shell.cancel)
        r2 = await executor.execute_code_blocks([sh("echo go; sleep 60; echo finished")], shell)
        precancelled = await executor.execute_code_blocks([py("print('never')")], token)
        after = await execute(executor, py("print(open('state.py').read().split()[-1])"))
        state = await execute(executor, py("print(kept)")) if mode == "interpreter" else None
        return r, took, r2, precancelled, after, state

    r, took, r2, precancelled, after, state = run(server, body, mode=mode)
    assert took < 3  # an interrupt, not the fallback of dropping the request
    assert r.exit_code == 125
    assert r.output.startswith("started\n") and r.output.endswith("KeyboardInterrupt\n\nCancelled")
    assert "finished" not in r.output and "never" not in r.output
    assert (r2.exit_code, r2.output) == (125, "go\n\nCancelled")
    assert (precancelled.exit_code, precancelled.output) == (125, "\nCancelled")
    assert (after.exit_code, after.output) == (0, "'kept'\n")
    if mode == "interpreter":  # Ctrl-C keeps the interpreter and what it holds
        assert (state.exit_code, state.output) == (0, "kept\n")


def test_restart_loses_state(server, client):
    async def body(executor):
        await execute(executor, py("x = 1\nopen('f.txt', 'w').write('data')"))
        first = executor.session.id
        assert [s.id for s in client.list_sessions()] == [first]
        await executor.restart()
        second = executor.session.id
        ids = [s.id for s in client.list_sessions()]
        r = await execute(executor, py("print(x)"), sh("cat f.txt"))
        files = await execute(executor, sh("ls -A"))
        return first, second, ids, r, files

    first, second, ids, r, files = run(server, body)
    assert first != second and ids == [second]
    assert r.exit_code == 1 and r.output.endswith("NameError: name 'x' is not defined\n")
    assert (files.exit_code, files.output) == (0, "")


def test_stop_closes_the_session(server, client):
    async def main():
        # Its own client, from base_url and token, closed by stop() as well.
        executor = KennelCodeExecutor(base_url=server.url, token=server.token)
        r = await execute(executor, py("print(2 ** 10)"))  # the first block opens the session
        opened = [s.id for s in client.list_sessions()]
        session_id = executor.session.id
        await executor.stop()
        after_stop = client.list_sessions()
        again = await execute(executor, py("print('again')"))
        reopened = executor.session.id
        await executor.stop()
        return r, opened, session_id, after_stop, again, reopened, executor.session

    r, opened, session_id, after_stop, again, reopened, session = asyncio.run(main())
    assert (r.exit_code, r.output) == (0, "1024\n")
    assert opened == [session_id]
    assert after_stop == []
    assert (again.exit_code, again.output) == (0, "again\n") and reopened != session_id
    assert session is None


def test_component_round_trip(server, monkeypatch):
    monkeypatch.setenv("KENNEL_TOKEN", server.token)
    model = KennelCodeExecutor(base_url=server.url, timeout=5, mode="files",
                               limits={"memory": "256M"}).dump_component()
    assert model.provider == "kennel.adapters.autogen.KennelCodeExecutor"
    assert model.config == {"base_url": server.url, "timeout": 5, "work_dir": "/workspace",
                            "mode": "files", "limits": {"memory": "256M"}}
    loaded = CodeExecutor.load_component(model)
    assert isinstance(loaded, KennelCodeExecutor)

    async def main():
        async with loaded:
            return await execute(loaded, sh("echo $((6 * 7))"))

    r = asyncio.run(main())
    assert (r.exit_code, r.output) == (0, "42\n")


def test_example_runs(server, run_example):
    stdout = run_example("autogen_example.py")
    primes = "2 3 5 7 11 13 17 19 23 29 31 37 41 43 47"
    assert stdout == (f"exit code 0, output:\n15 primes below 50\n{primes}\n"
                           "coder: There are 15 primes below 50; they are in primes.txt.\n"
                           f"primes.txt in the sandbox: {primes}\n")
