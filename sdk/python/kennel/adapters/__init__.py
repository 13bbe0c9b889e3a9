"""Kennel for the agent frameworks people use, each an optional extra of this package:

- ``kennel.adapters.langchain``: LangChain Deep Agents' sandbox backend (``kennel[langchain]``)
- ``kennel.adapters.openai_agents``: the OpenAI Agents SDK's sandbox client and session
  (``kennel[openai-agents]``)
- ``kennel.adapters.smolagents``: an executor for smolagents' ``CodeAgent``
  (``kennel[smolagents]``)
- ``kennel.adapters.pydantic_ai``: a pydantic-ai workspace backend (``kennel[pydantic-ai]``)
- ``kennel.adapters.autogen``: an AutoGen ``CodeExecutor`` (``kennel[autogen]``)

Each imports its framework when it is imported, never before: ``import kennel`` needs none.
"""
