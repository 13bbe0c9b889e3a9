"""Kennel for the agent frameworks people use, each an optional extra of this package:

- ``kennel.adapters.langchain``: LangChain Deep Agents' sandbox backend (``kennel-sdk[langchain]``)
- ``kennel.adapters.openai_agents``: the OpenAI Agents SDK's sandbox client and session
  (``kennel-sdk[openai-agents]``)
- ``kennel.adapters.smolagents``: an executor for smolagents' ``CodeAgent``
  (``kennel-sdk[smolagents]``)
- ``kennel.adapters.pydantic_ai``: a pydantic-ai workspace backend (``kennel-sdk[pydantic-ai]``)
- ``kennel.adapters.autogen``: an AutoGen ``CodeExecutor`` (``kennel-sdk[autogen]``)

Each imports its framework when it is imported, never before: ``import kennel`` needs none.
"""
