#!/usr/bin/env python3
"""A minimal agent loop that gives a model Kennel's `run_code` as a tool.

The model sits behind a one-method interface (`ModelClient.next_step`), so any chat API with
tool calling can be plugged in. Here a `ScriptedModel` plays the model: it makes a fixed list of
tool calls (compute something, write a file, read it back) and then gives a final answer built
from what the tools returned. Every tool call runs in one Kennel session, so Python variables
and files persist from one step to the next, as they would for a real agent.

    /usr/bin/python3 examples/agent_loop.py --server http://127.0.0.1:8080   # token: $KENNEL_TOKEN
    /usr/bin/python3 examples/agent_loop.py --start-server                    # starts kennel serve

It prints the transcript.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Union

REPO = Path(__file__).resolve().parent.parent
try:
    import kennel
except ImportError:  # not pip-installed: use the SDK from this repository
    sys.path.insert(0, str(REPO / "sdk" / "python"))
    import kennel


# -- the model interface ---------------------------------------------------------------------

@dataclass
class ToolCall:
    name: str
    arguments: Dict[str, Any]
    id: str = ""


@dataclass
class FinalAnswer:
    text: str


Step = Union[ToolCall, FinalAnswer]


class ModelClient(Protocol):
    """What the loop needs from a model: given the conversation so far (chat-style messages)
    and the tools it may call, the next step: a tool call or the final answer."""

    def next_step(self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> Step:
        ...


class ScriptedModel:
    """A stand-in model that replays fixed steps. A step may be a callable, which gets the
    messages so far (so a final answer can quote what the tools returned)."""

    def __init__(self, steps: List[Union[Step, Callable[[List[Dict[str, Any]]], Step]]]):
        self._steps = list(steps)

    def next_step(self, messages: List[Dict[str, Any]], tools: List[Dict[str, Any]]) -> Step:
        if not self._steps:
            return FinalAnswer("(the script has no more steps)")
        step = self._steps.pop(0)
        return step(messages) if callable(step) else step


# -- the tool --------------------------------------------------------------------------------

RUN_CODE_TOOL = {
    "name": "run_code",
    "description": (
        "Run code in a sandbox that persists for this conversation: Python variables survive "
        "between calls, and files under /workspace stay. Returns exit code, stdout and stderr."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "The code to run."},
            "language": {"type": "string", "enum": ["python", "bash", "sh"], "default": "python"},
        },
        "required": ["code"],
    },
}

MAX_TOOL_OUTPUT = 4000


def run_code_tool(session: "kennel.Session", arguments: Dict[str, Any]) -> str:
    """Runs a tool call in the session; what the model gets back, as text."""
    try:
        r = session.run_code(arguments["code"], arguments.get("language", "python"), timeout=30)
    except kennel.KennelError as e:  # the model sees the error and may try again
        return f"error: {e.message}"
    status = "timed out" if r.timed_out else f"exit code {r.exit_code}"
    out = f"{status}\nstdout:\n{r.stdout}"
    if r.stderr:
        out += f"\nstderr:\n{r.stderr}"
    return out[:MAX_TOOL_OUTPUT]


# -- the loop --------------------------------------------------------------------------------

@dataclass
class Transcript:
    lines: List[str] = field(default_factory=list)

    def say(self, who: str, text: str) -> None:
        body = text.rstrip("\n").replace("\n", "\n    ")
        line = f"[{who}] {body}"
        self.lines.append(line)
        print(line, flush=True)


def agent_loop(client: "kennel.Client", model: ModelClient, task: str,
               max_steps: int = 10) -> str:
    """Runs the conversation until the model answers (or `max_steps` tool calls)."""
    transcript = Transcript()
    messages: List[Dict[str, Any]] = [{"role": "user", "content": task}]
    transcript.say("user", task)
    with client.session() as session:
        transcript.say("kennel", f"session {session.id} started")
        for n in range(max_steps):
            step = model.next_step(messages, [RUN_CODE_TOOL])
            if isinstance(step, FinalAnswer):
                messages.append({"role": "assistant", "content": step.text})
                transcript.say("assistant", step.text)
                break
            call_id = step.id or f"call_{n}"
            messages.append({"role": "assistant", "tool_calls": [
                {"id": call_id, "name": step.name, "arguments": step.arguments}]})
            lang = step.arguments.get("language", "python")
            transcript.say("assistant", f"calls {step.name} ({lang}):\n{step.arguments.get('code', '')}")
            if step.name == RUN_CODE_TOOL["name"]:
                output = run_code_tool(session, step.arguments)
            else:
                output = f"error: no tool named {step.name!r}"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
            transcript.say("tool", output)
        else:
            transcript.say("kennel", f"stopped after {max_steps} steps without an answer")
    transcript.say("kennel", f"session {session.id} closed")
    return messages[-1].get("content", "")


def demo_model() -> ScriptedModel:
    """Compute something, keep it in a variable, write a file, read it back with bash, answer."""

    def answer(messages: List[Dict[str, Any]]) -> FinalAnswer:
        outputs = [m["content"] for m in messages if m["role"] == "tool"]
        total = outputs[0].split("stdout:\n", 1)[-1].strip()
        saved = next((line for line in outputs[-1].splitlines() if "sum of squares" in line),
                     "(nothing)")
        return FinalAnswer(f"The sum of the squares of 1 to 10 is {total}. "
                           f"/workspace/result.txt reads back as {saved!r}.")

    return ScriptedModel([
        ToolCall("run_code", {"code": "total = sum(i * i for i in range(1, 11))\nprint(total)"}),
        ToolCall("run_code", {"code": "with open('/workspace/result.txt', 'w') as f:\n"
                                      "    f.write(f'sum of squares = {total}\\n')\n"
                                      "print('wrote', len(open('/workspace/result.txt').read()), 'bytes')"}),
        ToolCall("run_code", {"language": "bash", "code": "ls /workspace && cat /workspace/result.txt"}),
        answer,
    ])


# -- running it ------------------------------------------------------------------------------

def start_server(binary: Path) -> "tuple[subprocess.Popen, str]":
    """`kennel serve` on a free loopback port (no token: loopback needs none); its log goes to
    a temporary directory."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = Path(tempfile.mkdtemp(prefix="kennel-agent-loop-"))
    config = workdir / "config.toml"
    config.write_text("[pool]\npython = 0\nbash = 0\n")
    log = workdir / "server.log"
    env = dict(os.environ)
    env.pop("KENNEL_TOKENS", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary), "serve", "--listen", f"127.0.0.1:{port}",
                                 "--config", str(config)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, env=env)
    proc.workdir = workdir  # type: ignore[attr-defined]  # removed by stop_server
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with kennel.Client(url, token="") as probe:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                probe.health()
                return proc, url
            except Exception:
                time.sleep(0.1)
    text = log.read_text(errors="replace")
    stop_server(proc)
    raise SystemExit(f"kennel serve did not start; its log:\n{text}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    workdir = getattr(proc, "workdir", None)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--server", help="the Kennel API URL (default: $KENNEL_URL or "
                                        "http://127.0.0.1:8080)")
    where.add_argument("--start-server", action="store_true",
                       help="start `kennel serve` for the run ($KENNEL_BIN or target/debug/kennel)")
    ap.add_argument("--token", help="bearer token (default: $KENNEL_TOKEN)")
    ap.add_argument("--task", default="What is the sum of the squares of 1 to 10? "
                                      "Save it to /workspace/result.txt.")
    args = ap.parse_args(argv)

    proc = None
    url = args.server
    token = args.token
    if args.start_server:
        binary = Path(os.environ.get("KENNEL_BIN") or REPO / "target" / "debug" / "kennel")
        proc, url = start_server(binary)
        token = ""
    try:
        with kennel.Client(url, token=token) as client:
            agent_loop(client, demo_model(), args.task)
    finally:
        if proc is not None:
            stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
