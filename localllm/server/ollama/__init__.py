"""The Ollama API: its request schemas and its routes."""
