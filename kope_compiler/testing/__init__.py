"""Test fixtures that ship with KOPE so that its loop can be exercised without hardware or
network: a local server speaking the OpenAI chat-completions protocol with scripted replies."""

from kope.testing.openai_server import Reply, ScriptedOpenAIServer

__all__ = ["Reply", "ScriptedOpenAIServer"]
