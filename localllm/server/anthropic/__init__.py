"""The Anthropic Messages API: its request schemas and its routes."""
