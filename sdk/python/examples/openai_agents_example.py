"""An OpenAI Agents SDK sandbox agent whose tools run in Kennel.

The model is the SDK's ScriptedModel, so no API key is needed: it writes notes.txt with the
apply_patch tool, sums it with python3 through exec_command, then answers. Both tools run in a
Kennel session that the runner makes and ends. Run against a server at $KENNEL_URL (default
http://127.0.0.1:8080), with $KENNEL_TOKEN if it wants one::

    pip install './sdk/python[openai-agents]'    # from the repository root
    python examples/openai_agents_example.py
"""

from agents import Runner
from agents.items import ToolCallOutputItem
from agents.run import RunConfig
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall

import kennel
from kennel.adapters.openai_agents import KennelSandboxClient

PATCH = "*** Begin Patch\n*** Add File: notes.txt\n+3\n+4\n+5\n*** End Patch\n"
SUM = "python3 -c \"print(sum(int(line) for line in open('notes.txt')))\""


def main() -> None:
    model = ScriptedModel([
        [ResponseCustomToolCall(type="custom_tool_call", call_id="p1", name="apply_patch",
                                input=PATCH)],
        [function_call("exec_command", {"cmd": SUM}, call_id="e1")],
        [assistant_message("the numbers in notes.txt add up to 12")],
    ])
    agent = SandboxAgent(name="adder", instructions="Use the sandbox.", model=model)
    with kennel.Client() as client:
        run_config = RunConfig(sandbox=SandboxRunConfig(client=KennelSandboxClient(client)),
                               tracing_disabled=True)
        result = Runner.run_sync(agent, "Add up the numbers in notes.txt.", run_config=run_config)
        outputs = [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]
        print("exec_command:", outputs[-1].split("Output:\n", 1)[1].strip())
        print("final output:", result.final_output)
        print("kennel sessions after the run:", len(client.list_sessions()))


if __name__ == "__main__":
    main()
