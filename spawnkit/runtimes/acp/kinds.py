"""How a spawnkit tool call is described in ACP terms: its kind, status and file locations.

ACP clients draw a tool call by its ``kind`` (an icon, a diff view for ``edit``) and the
files it touches (``locations``, which Zed follows). spawnkit's :class:`~spawnkit.result.ToolCall`
names a tool as its runtime does (Claude Code's ``Edit``, Codex's ``shell``, Gemini's
``replace``, an MCP tool as ``mcp__server__tool``); this module is the one table from those
names to ACP's words, shared by both directions of :mod:`spawnkit.runtimes.acp`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ...result import ToolStatus

AcpToolKind = Literal[
    "read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"
]  # fmt: skip
AcpToolStatus = Literal["pending", "in_progress", "completed", "failed"]

# Built-in tools of the three CLIs by what they do (MCP tools are "other": only their
# server knows what they do).
_KINDS: Mapping[str, AcpToolKind] = {
    # Claude Code
    "Read": "read", "NotebookRead": "read", "LS": "read",
    "Write": "edit", "Edit": "edit", "MultiEdit": "edit", "NotebookEdit": "edit",
    "Glob": "search", "Grep": "search", "WebSearch": "fetch",
    "Bash": "execute", "BashOutput": "execute", "KillShell": "execute", "KillBash": "execute",
    "WebFetch": "fetch", "Task": "think", "TodoWrite": "think", "ExitPlanMode": "switch_mode",
    # Codex (exec's item types, as spawnkit names them)
    "shell": "execute", "command_execution": "execute", "file_change": "edit",
    "apply_patch": "edit", "web_search": "fetch", "todo_list": "think", "reasoning": "think",
    # Gemini
    "read_file": "read", "read_many_files": "read", "list_directory": "read",
    "write_file": "edit", "replace": "edit", "glob": "search", "grep_search": "search",
    "search_file_content": "search", "run_shell_command": "execute", "web_fetch": "fetch",
    "google_web_search": "fetch", "write_todos": "think", "save_memory": "edit",
    "enter_plan_mode": "switch_mode", "exit_plan_mode": "switch_mode",
}  # fmt: skip

# The input keys under which the CLIs name the file a tool works on.
_PATH_KEYS = ("file_path", "absolute_path", "notebook_path", "path", "file")

_STATUS: Mapping[ToolStatus, AcpToolStatus] = {
    "running": "in_progress",
    "ok": "completed",
    "error": "failed",
}
_FROM_STATUS: Mapping[str, ToolStatus] = {
    "pending": "running",
    "in_progress": "running",
    "completed": "ok",
    "failed": "error",
}


def tool_kind(name: str) -> AcpToolKind:
    """ACP's kind of the tool ``name`` (as a runtime names it); ``"other"`` when unknown."""
    return _KINDS.get(name, "other")


def tool_locations(tool_input: Mapping[str, Any]) -> list[str]:
    """The file paths a tool call's input names (empty when it names none)."""
    found = []
    for key in _PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            found.append(value)
    return found


def acp_status(status: ToolStatus) -> AcpToolStatus:
    """A spawnkit tool call's status in ACP's words."""
    return _STATUS[status]


def spawnkit_status(status: str | None) -> ToolStatus:
    """An ACP tool call status in spawnkit's words (an unknown one counts as running)."""
    return _FROM_STATUS.get(status or "", "running")
