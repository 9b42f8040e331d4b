"""localllm: a local LLM runtime with a terminal chat and an OpenAI-compatible endpoint."""

__version__ = "0.1.0"
