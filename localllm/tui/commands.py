"""The chat's slash commands (/model, /system, /clear, /compact, /tools, /save, /help),
and compaction: the older turns of a conversation summarized by its model into one
block that the next answers read in their system message, so a long conversation keeps
going instead of dropping turns. `/compact` asks for it; the chat does it by itself when
an answer leaves the context over COMPACT_AT full, and says so."""

from __future__ import annotations

import dataclasses
from typing import Any

from localllm.backends.base import Message, SamplingParams
from localllm.engine.client import EngineClient
from localllm.engine.request import Request
from localllm.errors import LocalLLMError
from localllm.history import Conversation, History, StoredMessage
from localllm.tui.agent_turns import AgentTurns

COMMANDS = {
    "/model": "pick a model (F3), or /model NAME loads NAME",
    "/system": "/system TEXT sets this conversation's system prompt (alone: shows it)",
    "/clear": "start the context afresh (the turns stay on screen, out of the context)",
    "/compact": "summarize the older turns into one block the model keeps reading",
    "/tools": "the tools this conversation's model may call (Ctrl+T)",
    "/save": "write this conversation to Markdown (Ctrl+S)",
    "/help": "these commands",
}
COMPACT_AT = 0.8  # share of the context an answer may leave used before the chat compacts
KEEP_RECENT = 2  # messages a compaction leaves as they are (the last exchange)
SUMMARY_TOKENS = 400
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
SUMMARIZE = (
    "Summarize the conversation below for yourself, to continue it later without it: "
    "the user's goals and requests, facts and names given, decisions made, code or files "
    "discussed, and what is still open. Be brief and concrete; write only the summary."
)


def completions(text: str) -> list[str]:
    """The commands a prompt box's text could be the start of ("/co" -> ["/compact"])."""
    if not text.startswith("/") or " " in text or "\n" in text:
        return []
    return [c for c in COMMANDS if c.startswith(text)]


def summary_text(messages: list[StoredMessage]) -> str:
    """The summaries in context, for the system message."""
    return "\n\n".join(m.content for m in messages if m.role == "summary" and m.in_context)


class Commands(AgentTurns):
    engine: EngineClient
    history: History
    remote_model: str | None
    generating: bool

    def generate(self) -> Any:
        raise NotImplementedError

    def action_models(self) -> Any:
        raise NotImplementedError

    def action_export(self) -> None:
        raise NotImplementedError

    def switch_model(self, model: Any, *, remote: bool) -> None:
        raise NotImplementedError

    def action_tools(self) -> Any:
        raise NotImplementedError

    async def open_conversation(self, cid: int) -> None:
        raise NotImplementedError

    async def run_command(self, text: str) -> bool:
        """Run `text` as a slash command; False when it is not one (it is sent as a
        prompt). An unknown /word is not sent: the user is told the commands."""
        word, _, rest = text.strip().partition(" ")
        rest = rest.strip()
        if word not in COMMANDS:
            if "/" in word[1:] or not word[1:].isalpha():
                return False  # a path, say: a prompt
            self.notify(
                f"{word} is not a command; " + ", ".join(COMMANDS),
                title="Commands",
                severity="warning",
                timeout=10,
            )
            return True
        conv = self.conv
        if word == "/help":
            self.notify(
                "\n".join(f"{c}: {h}" for c, h in COMMANDS.items()), title="Commands", timeout=20
            )
        elif word == "/model":
            if rest:
                self.switch_model(rest, remote=self.engine.remotes.find(rest) is not None)
            else:
                self.action_models()
        elif word == "/tools":
            self.action_tools()
        elif word == "/save":
            self.action_export()
        elif conv is None:
            return True
        elif word == "/system":
            if rest:
                new = dataclasses.replace(conv.settings, system_prompt=rest)
                self.history.save_settings(conv.id, new)
                self.conv = self.history.get(conv.id)
                self.notify("System prompt set for this conversation.")
            else:
                said = conv.settings.system_prompt or "(none)"
                self.notify(said, title="System prompt", timeout=15)
        elif word == "/clear":
            ids = [m.id for m in self.history.messages(conv.id) if m.in_context]
            self.history.drop_from_context(ids)
            await self.open_conversation(conv.id)
            self.notify(f"The context starts afresh ({len(ids)} messages left out of it).")
        elif word == "/compact":
            self.compact_now()
        return True

    def compact_now(self) -> Any:
        """A worker in Answering (it shares the generate group)."""
        raise NotImplementedError

    async def compact(self, conv: Conversation, *, auto: bool) -> bool:
        """Summarize the conversation's in-context turns but the last KEEP_RECENT into one
        summary message (older summaries folded in), and leave them out of the context.
        False when there is too little to compact."""
        kept = [m for m in self.history.messages(conv.id) if m.in_context]
        turns = [m for m in kept if m.role != "summary"]
        older = turns[:-KEEP_RECENT] if len(turns) > KEEP_RECENT else []
        # the kept messages start at a prompt: a tool result never loses its call
        while older and turns[len(older)].role != "user":
            older = older[:-1]
        if not older:
            if not auto:
                self.notify("There is too little to compact yet.", title="Compact")
            return False
        earlier = summary_text(kept)
        transcript = "\n\n".join(f"{_speaker(m)}: {m.content}" for m in older)
        if earlier:
            transcript = f"{SUMMARY_PREFIX}{earlier}\n\n{transcript}"
        request = Request(
            SamplingParams.asked(temperature=0.2, max_tokens=SUMMARY_TOKENS),
            messages=[Message("system", SUMMARIZE), Message("user", transcript)],
            client="chat",
            model=self.remote_model,
        )
        self.notify(
            ("The context is nearly full: " if auto else "")
            + f"summarizing {len(older)} earlier messages…",
            title="Compact",
        )
        try:
            reply = await self.engine.submit(request).collect(0.5)
        except LocalLLMError as exc:
            self.notify(
                f"Could not summarize: {exc.message}", title="Compact", severity="error", timeout=10
            )
            return False
        summary = reply.text.strip()
        if not summary:
            self.notify(
                "The model wrote an empty summary; nothing was changed.",
                title="Compact",
                severity="warning",
            )
            return False
        made = reply.final.stats if reply.final is not None else None
        stats = {"summarized": len(older), "generated_tokens": made.generated_tokens if made else 0}
        self.history.add(conv.id, "summary", summary, stats)
        self.history.drop_from_context(
            [m.id for m in older] + [m.id for m in kept if m.role == "summary"]
        )
        if self.conv is not None and self.conv.id == conv.id:
            await self.open_conversation(conv.id)
        self.notify(
            f"{len(older)} earlier messages are now one summary the model reads.", title="Compact"
        )
        return True


def _speaker(m: StoredMessage) -> str:
    return {"user": "User", "assistant": "Assistant", "tool": "Tool result"}.get(m.role, m.role)
