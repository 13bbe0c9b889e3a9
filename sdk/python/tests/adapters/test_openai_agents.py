"""The OpenAI Agents SDK's sandbox agent on Kennel: the SDK's own Runner loop, driven by its
ScriptedModel, runs its apply_patch and exec_command tools in a live `kennel serve`."""

import asyncio
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("agents")

from agents import Runner  # noqa: E402
from agents.items import ToolCallOutputItem  # noqa: E402
from agents.run import RunConfig  # noqa: E402
from agents.sandbox import (LocalSnapshotSpec, Manifest, SandboxAgent,  # noqa: E402
                            SandboxRunConfig)
from agents.sandbox.errors import ExecTimeoutError, WorkspaceReadNotFoundError  # noqa: E402
from agents.sandbox.manifest import Environment  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseCustomToolCall  # noqa: E402

from kennel.adapters.openai_agents import (KennelSandboxClient,  # noqa: E402
                                           KennelSandboxClientOptions, KennelSandboxSession)

SDK_DIR = Path(__file__).resolve().parents[2]

ADD = "*** Begin Patch\n*** Add File: notes/data.txt\n+3\n+4\n+5\n*** End Patch\n"
UPDATE = "*** Begin Patch\n*** Update File: notes/data.txt\n@@\n 3\n-4\n+40\n 5\n*** End Patch\n"
SUM = "python3 -c \"print(sum(int(l) for l in open('notes/data.txt')))\" | tee notes/sum.txt; pwd"


def patch_call(call_id: str, patch: str) -> ResponseCustomToolCall:
    return ResponseCustomToolCall(type="custom_tool_call", call_id=call_id, name="apply_patch",
                                  input=patch)


def script() -> ScriptedModel:
    """Write a file (apply_patch: the session's write), sum it in the sandbox (exec_command),
    edit it (apply_patch update: read then write), sum it again."""
    return ScriptedModel([
        [patch_call("p1", ADD)],
        [function_call("exec_command", {"cmd": SUM}, call_id="e1")],
        [patch_call("p2", UPDATE)],
        [function_call("exec_command", {"cmd": SUM}, call_id="e2")],
        [assistant_message("the sums are 12 and 48")],
    ])


def tool_outputs(result) -> list:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


def exec_output(text: str) -> str:
    assert "Process exited with code 0" in text, text
    return text.split("Output:\n", 1)[1]


def tar_files(data: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return {m.name: t.extractfile(m).read() for m in t if m.isfile()}


def test_runner_owned_session_runs_in_kennel_and_snapshots(client, tmp_path):
    model = script()
    agent = SandboxAgent(name="coder", instructions="use the sandbox", model=model)
    sandbox = SandboxRunConfig(client=KennelSandboxClient(client),
                               snapshot=LocalSnapshotSpec(base_path=tmp_path))
    result = Runner.run_sync(agent, "sum notes/data.txt",
                             run_config=RunConfig(sandbox=sandbox, tracing_disabled=True))
    model.assert_complete()
    assert result.final_output == "the sums are 12 and 48"
    outputs = tool_outputs(result)
    assert len(outputs) == 4
    assert outputs[0] == "Created notes/data.txt"
    assert exec_output(outputs[1]) == "12\n/workspace\n"
    assert outputs[2] == "Updated notes/data.txt"
    assert exec_output(outputs[3]) == "48\n/workspace\n"
    # The runner's cleanup persisted the workspace (persist_workspace: Kennel's archive) into
    # the snapshot, then ended the Kennel session.
    (snapshot,) = tmp_path.iterdir()
    assert tar_files(snapshot.read_bytes()) == {"notes/data.txt": b"3\n40\n5",
                                                "notes/sum.txt": b"48\n"}
    assert client.list_sessions() == []


def test_live_session_is_read_back_through_kennel(client):
    model = script()
    agent = SandboxAgent(name="coder", instructions="use the sandbox", model=model)
    sandbox_client = KennelSandboxClient(client)

    async def main() -> tuple:
        async with await sandbox_client.create(manifest=Manifest()) as session:
            kennel_id = session._inner.state.kennel_session_id
            assert [s.id for s in client.list_sessions()] == [kennel_id]
            result = await Runner.run(
                agent, "sum notes/data.txt",
                run_config=RunConfig(sandbox=SandboxRunConfig(session=session),
                                     tracing_disabled=True))
            raw = client.attach(kennel_id)
            return (result, raw.read_file("notes/data.txt"),
                    raw.read_file("/workspace/notes/sum.txt"))

    result, data, total = asyncio.run(main())
    model.assert_complete()
    assert data == b"3\n40\n5" and total == b"48\n"
    assert exec_output(tool_outputs(result)[3]) == "48\n/workspace\n"
    assert client.list_sessions() == []


def test_session_methods_and_persist_then_hydrate(client):
    sandbox_client = KennelSandboxClient(client)
    manifest = Manifest(environment=Environment(value={"GREETING": "hello from kennel"}))

    async def main() -> None:
        async with await sandbox_client.create(
                manifest=manifest, options=KennelSandboxClientOptions(env={"BASE": "b"})) as one:
            assert isinstance(one._inner, KennelSandboxSession)
            r = await one.exec("echo $GREETING $BASE; echo oops >&2; pwd; exit 3")
            assert (r.stdout, r.stderr, r.exit_code) == (
                b"hello from kennel b\n/workspace\n", b"oops\n", 3)
            r = await one.exec("python3", "-c", "print(6 * 7)", shell=False)
            assert (r.stdout, r.exit_code) == (b"42\n", 0)
            with pytest.raises(ExecTimeoutError):
                await one.exec("sleep 5", timeout=0.5)

            blob = bytes(range(256))
            await one.write(Path("data/blob.bin"), io.BytesIO(blob))
            assert (await one.read(Path("/workspace/data/blob.bin"))).read() == blob
            assert client.attach(one._inner.state.kennel_session_id).read_file(
                "data/blob.bin") == blob
            r = await one.exec("sha256sum data/blob.bin | cut -c1-16")
            assert r.stdout == b"40aff2e9d2d8922e\n"
            with pytest.raises(WorkspaceReadNotFoundError):
                await one.read(Path("missing.txt"))
            await one.write(Path("src/main.py"), io.BytesIO(b"print('persisted')\n"))
            archive = (await one.persist_workspace()).read()

        assert tar_files(archive) == {"data/blob.bin": blob,
                                      "src/main.py": b"print('persisted')\n"}
        assert client.list_sessions() == []

        async with await sandbox_client.create(manifest=Manifest()) as two:
            assert (await two.exec("ls")).stdout == b""
            await two.hydrate_workspace(io.BytesIO(archive))
            assert (await two.read(Path("data/blob.bin"))).read() == blob
            r = await two.exec("python3 src/main.py")
            assert (r.stdout, r.exit_code) == (b"persisted\n", 0)

    asyncio.run(main())
    assert client.list_sessions() == []


def test_refuses_a_root_kennel_does_not_serve(client):
    with pytest.raises(ValueError, match="kennel workspace root"):
        asyncio.run(KennelSandboxClient(client).create(manifest=Manifest(root="/srv/app")))
    assert client.list_sessions() == []


def test_import_kennel_does_not_import_the_sdk():
    code = "import sys, kennel; assert 'agents' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(
        os.environ, PYTHONPATH=str(SDK_DIR)))


def test_resume_reattaches_then_restores_from_snapshot(client, tmp_path):
    sandbox_client = KennelSandboxClient(client)

    async def main() -> None:
        session = await sandbox_client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path))
        await session.start()
        await session.write(Path("kept.txt"), io.BytesIO(b"across sessions\n"))
        payload = sandbox_client.serialize_session_state(session.state)
        first_id = session._inner.state.kennel_session_id

        # While the Kennel session lives, resume reattaches to it.
        again = await sandbox_client.resume(sandbox_client.deserialize_session_state(dict(payload)))
        assert again._inner.state.kennel_session_id == first_id
        assert (await again.read(Path("kept.txt"))).read() == b"across sessions\n"

        await session.aclose()  # persists the snapshot, then ends the Kennel session
        assert client.list_sessions() == []
        payload = sandbox_client.serialize_session_state(session.state)

        # Once it has ended, resume makes a new one and start() hydrates it from the snapshot.
        resumed = await sandbox_client.resume(sandbox_client.deserialize_session_state(payload))
        async with resumed:
            assert resumed._inner.state.kennel_session_id != first_id
            assert (await resumed.exec("cat kept.txt")).stdout == b"across sessions\n"
        await sandbox_client.delete(again)

    asyncio.run(main())
    assert client.list_sessions() == []


def test_example_runs(server, client, run_example):
    assert run_example("openai_agents_example.py").splitlines() == [
        "exec_command: 12",
        "final output: the numbers in notes.txt add up to 12",
        "kennel sessions after the run: 0",
    ]
    assert client.list_sessions() == []
