"""A pydantic-ai agent whose commands and files live in a Kennel session.

The model is pydantic-ai's FunctionModel, scripted below, so this runs without an API key:
swap in a real model ("openai:gpt-5.2", ...) and the tools work the same. Needs a server::

    kennel serve &            # then, with its token:
    KENNEL_URL=http://127.0.0.1:8080 KENNEL_TOKEN=... python examples/pydantic_ai_example.py
"""

from typing import List

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import kennel
from kennel.adapters.pydantic_ai import KennelWorkspace

PRIMES = """\
primes = [n for n in range(2, 30) if all(n % d for d in range(2, n))]
print("primes below 30:", primes)
"""


def scripted_model(messages: List[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for an LLM: writes a script, runs it, then reports what it printed."""
    returns = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("write_file", {"path": "primes.py", "content": PRIMES})])
    if len(returns) == 1:
        return ModelResponse(parts=[ToolCallPart("run_command", {"command": "python3 primes.py"})])
    return ModelResponse(parts=[TextPart("the sandbox says: " + returns[-1].content["stdout"].strip())])


def main() -> None:
    workspace = KennelWorkspace(kennel.Client())  # $KENNEL_URL and $KENNEL_TOKEN
    agent = Agent(FunctionModel(scripted_model), capabilities=[workspace])
    try:
        result = agent.run_sync("Which numbers below 30 are prime? Compute it in the sandbox.")
        print(result.output)
        print("session:", result.workspace.ref.id)
    finally:
        workspace.close()  # ends the session the run used


if __name__ == "__main__":
    main()
