"""The OpenAI API: its request schemas and its routes."""
