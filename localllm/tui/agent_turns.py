"""The chat as a local agent: the tools a conversation offers (agent/), the approval of
each call in a dialog, the calls run and their results folded into the conversation and
the history, and the loop back to the model, up to the conversation's step limit. Esc
stops it anywhere (mid-answer, in a dialog, during a command) and keeps what happened.
`Answering` (tui/answering.py) calls `run_calls` when an answer ends in tool calls."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from textual.app import App
from textual.containers import VerticalScroll

from localllm.agent.builtin import builtin_tools
from localllm.agent.mcp_host import McpHost
from localllm.agent.session import AgentSession, Decision, ToolRun
from localllm.agent.tool import Preview, Tool
from localllm.agent.workspace import Workspace
from localllm.backends.base import ToolCall
from localllm.config import Settings
from localllm.history import Conversation, History
from localllm.tui.screens.approval import ApprovalScreen, ToolChoices, ToolsScreen
from localllm.tui.widgets.messages import ChatMessage


class AgentTurns(App[None]):
    settings: Settings
    history: History
    conv: Conversation | None
    mcp: McpHost | None
    _tool_task: asyncio.Task[ToolRun] | None
    _agents: dict[int, tuple[Any, AgentSession]]
    _turn_stopped: bool

    @property
    def chat(self) -> VerticalScroll:
        raise NotImplementedError

    def start_tools(self) -> None:
        """Connect the configured MCP servers (in the background; the chat goes on)."""
        self._agents = {}
        self._tool_task = None
        self._turn_stopped = False
        self.mcp = None
        if any(s.enabled for s in self.settings.mcp_servers):
            self.mcp = McpHost(
                self.settings.mcp_servers,
                log_file=self.settings.data_dir / "logs" / "mcp.log",
                on_change=lambda: self.call_from_thread(self.show_tools_state),
            )
            self.mcp.start()

    def stop_tools(self) -> None:
        if self._tool_task is not None:
            self._tool_task.cancel()
        if self.mcp is not None:
            self.mcp.close()

    def show_tools_state(self) -> None:
        """The MCP servers that are not ready, in the status bar (one line each)."""
        raise NotImplementedError

    # -- a conversation's tools --------------------------------------------------------
    def tool_choices(self, conv: Conversation) -> ToolChoices:
        s = conv.settings
        return ToolChoices(
            s.tools if s.tools is not None else self.settings.chat_tools,
            s.tool_folder or str(Path.cwd()),
            s.tool_steps or self.settings.agent_steps,
        )

    def agent_for(self, conv: Conversation) -> AgentSession:
        """The conversation's tools and approvals (kept while its tool choice stands)."""
        choices = self.tool_choices(conv)
        servers = tuple(t.removeprefix("mcp:") for t in choices.tools if t.startswith("mcp:"))
        tools: list[Tool] = builtin_tools(Workspace(Path(choices.folder)), choices.tools)
        if self.mcp is not None and servers:
            tools += self.mcp.tools(servers)
        key = (choices.tools, choices.folder, tuple(t.name for t in tools))
        held = self._agents.get(conv.id)
        if held is None or held[0] != key:
            keep = held[1].always if held is not None else set()
            session = AgentSession(tools)
            session.always = {n for n in keep if n in session.tools}
            self._agents[conv.id] = (key, session)
        return self._agents[conv.id][1]

    async def choose_tools(self) -> None:
        """The tools dialog (from F4, /tools or Ctrl+T): the choice is the conversation's."""
        conv = self.conv
        if conv is None:
            return
        states = self.mcp.states() if self.mcp is not None else {}
        choice = await self.push_screen_wait(ToolsScreen(self.tool_choices(conv), states))
        if choice is None:
            return
        new = dataclasses.replace(
            conv.settings, tools=choice.tools, tool_folder=choice.folder, tool_steps=choice.steps
        )
        self.history.save_settings(conv.id, new)
        self.conv = self.history.get(conv.id)
        on = ", ".join(choice.tools) or "none"
        self.notify(f"Tools for this conversation: {on}", title="Tools")

    # -- the calls of one answer -------------------------------------------------------
    async def run_calls(
        self, conv: Conversation, calls: tuple[ToolCall, ...], *, over_limit: bool
    ) -> bool:
        """Run an answer's calls in order (each approved), their results stored and
        shown; False when the loop ends here (Esc, or the step limit was reached)."""
        session = self.agent_for(conv)
        self._turn_stopped = False
        for call in calls:
            if over_limit or self._turn_stopped:
                why = (
                    f"the chat's limit of {self.tool_choices(conv).steps} tool steps "
                    "per answer was reached"
                    if over_limit
                    else "the user stopped the turn"
                )
                await self._record(conv, ToolRun(call, f"Not run: {why}.", "not run"))
                continue
            task = asyncio.create_task(session.run(call, self._approve))
            self._tool_task = task
            try:
                run = await task
            except asyncio.CancelledError:
                if not self._turn_stopped:
                    raise  # the app is closing
                run = ToolRun(call, "Stopped by the user while it ran.", "stopped")
            finally:
                self._tool_task = None
            if run.status == "stopped":
                self._turn_stopped = True
            await self._record(conv, run)
        if over_limit:
            self.notify(
                f"Stopped after {self.tool_choices(conv).steps} tool steps (the limit is in "
                "F4, Tools); send a message to let the model go on.",
                title="Tool steps",
                timeout=10,
            )
        return not (over_limit or self._turn_stopped)

    def stop_turn(self) -> None:
        """Esc: a running tool is stopped, and no further call or answer follows."""
        self._turn_stopped = True
        if self._tool_task is not None:
            self._tool_task.cancel()

    async def _approve(self, tool: Tool, args: dict[str, Any], preview: Preview) -> Decision:
        del args
        if self._turn_stopped:
            return "stop"
        return await self.push_screen_wait(ApprovalScreen(tool.name, tool.source, preview))

    async def _record(self, conv: Conversation, run: ToolRun) -> None:
        record = run.record()
        mid = self.history.add(conv.id, "tool", run.result, record)
        if self.conv is not None and self.conv.id == conv.id:
            await self.chat.mount(ChatMessage("tool", run.result, stats=record, message_id=mid))
            self.chat.scroll_end(animate=False)
