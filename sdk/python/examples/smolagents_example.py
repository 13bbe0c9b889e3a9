"""A smolagents CodeAgent whose code runs in a Kennel sandbox, with no API key needed.

The model is scripted (smolagents ships no fake model): step 1's code fails, step 2 fixes it
using a variable step 1 left in the sandbox's interpreter, and calls final_answer there.

    KENNEL_URL=http://127.0.0.1:8080 KENNEL_TOKEN=... python examples/smolagents_example.py
"""

from typing import Any, List

from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel

from kennel.adapters.smolagents import KennelExecutor

STEPS = [
    ("Thought: compute the squares, then divide.\n<code>\n"
     "squares = [i * i for i in range(10)]\nprint('sum of squares:', sum(squares))\n"
     "ratio = sum(squares) / count\n</code>"),
    ("Thought: `count` was not defined; use len(squares).\n<code>\n"
     "import os\nprint('running in', os.getcwd())\n"
     "final_answer(sum(squares) / len(squares))\n</code>"),
]


class ScriptedModel(Model):
    """Answers each step with the next of STEPS, whatever the messages say."""

    def __init__(self, outputs: List[str]):
        super().__init__(model_id="scripted")
        self.outputs = list(outputs)

    def generate(self, messages: List[Any], **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.outputs.pop(0))


def main() -> None:
    # The client comes from $KENNEL_URL and $KENNEL_TOKEN; the agent's cleanup closes the session.
    executor = KennelExecutor(logger=AgentLogger(LogLevel.OFF))
    with CodeAgent(tools=[], model=ScriptedModel(STEPS), executor=executor,
                   verbosity_level=LogLevel.OFF) as agent:
        answer = agent.run("What is the mean of the squares of 0..9?")
        for step in agent.memory.steps[1:]:
            if getattr(step, "error", None) is not None:
                lines = step.error.message.splitlines()
                print(f"step {step.step_number} error: {lines[0]!r} ... {lines[-1]!r}")
            elif getattr(step, "observations", None):
                print(f"step {step.step_number} logs: {step.observations.splitlines()[1:]}")
        print("answer:", answer)


if __name__ == "__main__":
    main()
