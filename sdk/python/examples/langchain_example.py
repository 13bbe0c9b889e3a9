"""A LangChain deep agent whose shell and files are a Kennel session.

The model is langchain_core's scripted fake, so this runs without API keys: it asks for a
command, a file write and a file read, and the deep agent's own tools carry them out in Kennel.

    KENNEL_URL=http://127.0.0.1:8080 KENNEL_TOKEN=... python examples/langchain_example.py
"""

from typing import Any

from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

import kennel
from kennel.adapters.langchain import KennelSandbox


class ScriptedModel(GenericFakeChatModel):
    """Answers with the scripted messages; the tools deepagents binds are only named in them."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self


def call(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{name}"}])


def main() -> None:
    model = ScriptedModel(messages=iter([
        call("execute", command="python3 -c 'print(sum(i * i for i in range(1, 11)))' | tee squares.txt"),
        call("write_file", file_path="/workspace/report.md", content="# Squares\n\nSee squares.txt.\n"),
        call("read_file", file_path="/workspace/squares.txt"),
        AIMessage(content="The sum of the squares of 1 to 10 is 385."),
    ]))
    with KennelSandbox(kennel.Client()) as sandbox:  # $KENNEL_URL and $KENNEL_TOKEN
        print(f"[kennel] session {sandbox.id} started")
        agent = create_deep_agent(model=model, backend=sandbox)
        state = agent.invoke({"messages": [{"role": "user", "content": "Sum the squares of 1 to 10."}]})
        for message in state["messages"]:
            for tool_call in getattr(message, "tool_calls", None) or []:
                print(f"[assistant] calls {tool_call['name']} {tool_call['args']}")
            if message.type == "tool":
                print(f"[tool {message.name}] {message.content}")
            elif message.content:
                print(f"[{message.type}] {message.content}")
        report = sandbox.session.read_file("/workspace/report.md").decode()
        print(f"[kennel] /workspace/report.md: {report!r}")
    print(f"[kennel] session {sandbox.id} closed")


if __name__ == "__main__":
    main()
