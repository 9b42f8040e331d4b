"""The OpenAI-compatible HTTP endpoint."""
