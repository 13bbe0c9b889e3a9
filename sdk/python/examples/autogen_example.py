"""AutoGen's CodeExecutorAgent running its model's code in a Kennel sandbox.

The model is autogen's ReplayChatCompletionClient (scripted answers, no API key): it answers
with a python and a sh block, the agent runs them through KennelCodeExecutor, then the model
"reflects" on the output. Needs `pip install './sdk/python[autogen]'` (from the repository
root) and a server at $KENNEL_URL (default http://127.0.0.1:8080), with $KENNEL_TOKEN if it
wants one.

    python examples/autogen_example.py
"""

import asyncio

from autogen_agentchat.agents import ApprovalRequest, ApprovalResponse, CodeExecutorAgent
from autogen_agentchat.messages import CodeExecutionEvent, TextMessage
from autogen_ext.models.replay import ReplayChatCompletionClient

import kennel
from kennel.adapters.autogen import KennelCodeExecutor

MODEL_ANSWERS = [
    "Let me compute them.\n"
    "```python\n"
    "primes = [n for n in range(2, 50) if all(n % d for d in range(2, n))]\n"
    "open('primes.txt', 'w').write(' '.join(map(str, primes)))\n"
    "print(len(primes), 'primes below 50')\n"
    "```\n"
    "```sh\n"
    "cat primes.txt\n"
    "```",
    "There are 15 primes below 50; they are in primes.txt.",
]


async def main() -> None:
    model = ReplayChatCompletionClient(MODEL_ANSWERS)
    async with KennelCodeExecutor(kennel.AsyncClient()) as executor:
        agent = CodeExecutorAgent("coder", code_executor=executor, model_client=model,
                                  approval_func=approve)
        async for event in agent.run_stream(task="Which numbers below 50 are prime?"):
            if isinstance(event, CodeExecutionEvent):
                print(f"exit code {event.result.exit_code}, output:\n{event.result.output}")
            elif isinstance(event, TextMessage) and event.source == "coder":
                print(f"coder: {event.content}")
        assert executor.session is not None
        print("primes.txt in the sandbox:", (await executor.session.read_file("primes.txt")).decode())


def approve(request: ApprovalRequest) -> ApprovalResponse:
    """Every block is approved: it runs in the sandbox, not on this machine."""
    return ApprovalResponse(approved=True, reason="it runs in a kennel sandbox")


if __name__ == "__main__":
    asyncio.run(main())
