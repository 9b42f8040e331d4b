"""What every tool of the chat is: a name, a description and a JSON Schema the model
reads, what the user is shown before approving a call, and the call itself. Built-in
tools (agent/builtin.py) and an MCP server's (agent/mcp_host.py) are both this."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import jsonschema

from localllm import jsontext
from localllm.agent.workspace import ToolRefused

RESULT_LIMIT = 16_000  # characters of a result the model gets back


@dataclass(frozen=True, slots=True)
class Preview:
    """What the approval dialog shows: the call's arguments, or a diff or command."""

    text: str
    language: str | None = None  # "diff", "bash": shown highlighted


class Tool(ABC):
    name: str
    description: str
    parameters: dict[str, Any]  # the arguments' JSON Schema
    source: str = "built-in"  # or the MCP server's name

    def function(self) -> dict[str, Any]:
        """The tool as a request's `tools` entry (OpenAI's shape)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def checked(self, arguments: str) -> dict[str, Any]:
        """The call's arguments parsed and held to the schema; ToolRefused otherwise (the
        model is told why and nothing runs)."""
        try:
            args = jsontext.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolRefused(f"the arguments are not JSON ({exc.msg} at {exc.pos})") from None
        if not isinstance(args, dict):
            raise ToolRefused(f"the arguments must be a JSON object, not {type(args).__name__}")
        errors = sorted(
            jsonschema.Draft202012Validator(self.parameters).iter_errors(args),
            key=lambda e: list(e.path),
        )
        if errors:
            where = ".".join(str(p) for p in errors[0].path)
            at = f" at '{where}'" if where else ""
            raise ToolRefused(
                f"the arguments do not match {self.name}'s schema{at}: {errors[0].message}"
            )
        return args

    def refusal(self, args: dict[str, Any]) -> None:
        """ToolRefused when the call cannot run whatever the user says (a path outside
        the folder, a file that is not there): checked before the user is asked. Most
        tools know of no such case."""
        del args

    def preview(self, args: dict[str, Any]) -> Preview:
        return Preview(json.dumps(args, indent=2, ensure_ascii=False), "json")

    @abstractmethod
    async def call(self, args: dict[str, Any]) -> str:
        """Run the call: its result as text; ToolRefused for a call it will not run."""


def bounded(text: str, limit: int = RESULT_LIMIT) -> str:
    """A result cut to `limit` characters, saying so with both numbers."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[cut: {limit:,} of {len(text):,} characters shown]"
