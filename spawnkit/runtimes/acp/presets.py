"""The ACP agents spawnkit knows: how to point each at a model server and give it a prompt.

Any ACP agent runs as a spawnkit runtime from its command line alone; three are
known better, by their command: ``gemini --acp`` (Gemini CLI), ``claude-code-acp``
(Zed's adapter over the Claude Agent SDK) and ``codex-acp`` (Zed's adapter over Codex).
Each is the native runtime's CLI underneath, so a preset sets it up with that
runtime's own code (its settings, config file, home and environment), points it at the
run's model relay (``--replay`` works, as for the native runtimes), and gives it the
system prompt its own way:

* Gemini: ``GEMINI_SYSTEM_MD`` (a file that replaces its system instruction) and the
  run's ``settings.json`` (turn limit, the built-in tools the butler lists);
* claude-code-acp: ``session/new``'s ``_meta.systemPrompt``, and Claude Agent SDK options
  in ``_meta.claudeCode.options`` (turn limit, model, no user settings, the built-in tools
  the butler does not list disallowed); ``IS_SANDBOX=1`` when spawnkit runs as root
  (Claude Code refuses to start as root otherwise);
* codex-acp: ``developer_instructions`` in the run's ``CODEX_HOME/config.toml``, with the
  model provider as for ``codex exec``.

An unknown agent gets the system prompt at the head of its prompt.
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import tomli_w

from ...transcripts import copy_file
from ..base import RunSpec, RuntimeAdapter, write_private
from ..claude_code import ClaudeCodeAdapter, project_dir_name, seed_home
from ..codex import CodexAdapter, run_model
from ..codex_native import native_codex_acp
from ..gemini import DEFAULT_MODEL, GeminiAdapter, project_slug


class AcpPreset:
    """A known ACP agent: what spawnkit sets up for it. The base is any other agent."""

    # The native runtime whose CLI the agent drives ("" for an unknown agent).
    native: ClassVar[str] = ""
    # The program's name on the command line, and how to install it.
    program: ClassVar[str] = ""
    install_hint: ClassVar[str] = (
        "install the agent, or change [butler.runtime] command to a program that exists"
    )
    # Overrides where the program is found (as SPAWNKIT_GEMINI_CLI does for gemini).
    binary_env: ClassVar[str] = "SPAWNKIT_ACP_AGENT"
    # Whether the system prompt reaches it only at the head of the prompt.
    system_in_prompt: ClassVar[bool] = True
    # Whether the agent enforces max_turns itself (else spawnkit counts tool calls).
    native_turn_limit: ClassVar[bool] = False
    # How the program prints its version (None: it has no way; the ACP adapters do not,
    # they say it in initialize's agentInfo).
    version_args: ClassVar[tuple[str, ...] | None] = None
    # Whether spawnkit can continue one of its sessions (False: known not to work).
    resumes: ClassVar[bool] = True
    # The starts of text chunks that are the agent's own warnings, not the model's.
    noise: ClassVar[tuple[str, ...]] = ()
    # Whether the run's relay meters the agent's model calls (a known model API only): for
    # live figures, and for the record of an agent that tells no token usage of its own.
    metered: ClassVar[bool] = False

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)

    @classmethod
    def matches(cls, argv: Sequence[str]) -> bool:
        return bool(cls.program) and bool(argv) and Path(argv[0]).name == cls.program

    def native_adapter(self) -> RuntimeAdapter | None:
        return None

    def command(self, spec: RunSpec, program: str) -> list[str]:
        """The agent's argv for this run, its program resolved."""
        return [program, *self.argv[1:]]

    def build_config_file(self, workspace: Path) -> Path:
        """The agent's configuration in the run's home (no MCP server: that goes in
        ``session/new``)."""
        path = workspace / "acp-agent.json"
        write_private(path, json.dumps({"command": list(self.argv)}, indent=2))
        return path

    def prepare(self, spec: RunSpec) -> None:
        """Write what depends on the run (its prompt, tools, model) before the agent starts."""

    def env(self, spec: RunSpec) -> dict[str, str]:
        tmp = spec.workspace / "tmp"
        tmp.mkdir(exist_ok=True, mode=0o700)
        return {**spec.env, "HOME": str(spec.workspace), "TMPDIR": str(tmp), "NO_COLOR": "1"}

    def session_meta(self, spec: RunSpec) -> dict[str, Any]:
        """What ``session/new`` carries in ``_meta`` for this agent."""
        return {}

    def model(self, spec: RunSpec) -> str | None:
        """The model the run asks the agent for (None: the agent's own choice, unnamed):
        what its usage is priced at when the agent names none."""
        return spec.model

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        """Put a kept transcript back where the agent finds it (its native runtime's way)."""
        native = self.native_adapter()
        return native is not None and native.stage_resume(home, cwd, runtime_session_id)

    def replayed(self, spec: RunSpec, session_id: str) -> int | None:
        """How many updates the agent's session/load of ``session_id`` replays after it has
        answered the load (None: it answers once the replay is over, as ACP intends)."""
        return None

    def transcript(self, spec: RunSpec, session_id: str) -> Path | None:
        """The file the agent writes a session's transcript to, when a resume needs it
        whole before the agent is stopped; None: nothing to wait for."""
        return None

    def turn_logged(self, last_line: bytes, answer: str) -> bool:
        """Whether the transcript's last line is the end of the turn that answered
        ``answer``: then it is written. False: wait until the file stops changing."""
        return False


class GeminiPreset(AcpPreset):
    native = "gemini"
    program = "gemini"
    install_hint = GeminiAdapter.install_hint
    binary_env = GeminiAdapter.binary_env
    version_args = GeminiAdapter.version_args
    system_in_prompt = False
    native_turn_limit = True
    # Its tokens come only with the prompt's result (_meta.quota): metered for live figures.
    metered = True

    @classmethod
    def matches(cls, argv: Sequence[str]) -> bool:
        return super().matches(argv) and any(a in ("--acp", "--experimental-acp") for a in argv)

    def native_adapter(self) -> GeminiAdapter:
        return GeminiAdapter()

    def command(self, spec: RunSpec, program: str) -> list[str]:
        argv = super().command(spec, program)
        if not {"-m", "--model"} & set(argv):
            argv += ["-m", spec.model or DEFAULT_MODEL]  # no extra model-routing request
        return argv

    def model(self, spec: RunSpec) -> str | None:
        named = [arg for flag, arg in itertools.pairwise(self.argv) if flag in ("-m", "--model")]
        return named[-1] if named else spec.model or DEFAULT_MODEL

    def build_config_file(self, workspace: Path) -> Path:
        return self.native_adapter().build_config_file(workspace, None)

    def stage_resume(self, home: Path, cwd: Path, runtime_session_id: str) -> bool:
        """The chat, where ``gemini --resume`` finds it, under a name Gemini never gives.

        Gemini 0.61's ``session/load`` first starts a new recording of the session it is
        asked for, in ``session-<minute>-<id[:8]>.jsonl``, and only then looks for the
        chat to load: a chat staged under its own name, from the same minute (a second
        prompt within a minute of the first), is overwritten by that empty recording and
        the load answers "No previous sessions found". ``session-resumed-...`` cannot be
        overwritten so; the load then continues the conversation in it.
        """
        found = _fullest_chat(GeminiAdapter.kept_transcripts(), runtime_session_id)
        if found is None:
            return False
        name = found.name
        if not name.startswith(RESUMED_CHAT):
            name = RESUMED_CHAT + name.removeprefix("session-")
        project = home / ".gemini" / "tmp" / project_slug(cwd)
        if not copy_file(found, project / "chats" / name):
            return False
        (project / ".project_root").write_text(str(cwd), encoding="utf-8")
        return True

    def replayed(self, spec: RunSpec, session_id: str) -> int | None:
        """Gemini answers session/load before it has replayed the chat (its replay is not
        awaited): the updates to come, counted from the staged chat as Gemini replays it
        (a user message's text; a model message's thoughts, text and tool calls)."""
        chats = spec.workspace / ".gemini" / "tmp" / project_slug(spec.cwd) / "chats"
        staged = sorted(chats.glob(f"{RESUMED_CHAT}*-{session_id[:8]}.json*"))
        if not staged:
            return None
        messages = _chat_messages(staged[-1])
        return None if messages is None else sum(map(_replayed_updates, messages))

    def prepare(self, spec: RunSpec) -> None:
        # The tools the butler asks about stay (not excluded), and are not auto-approved:
        # Gemini asks for them with session/request_permission.
        settings = GeminiAdapter.settings(
            None, [*spec.tools, *spec.ask], spec.max_turns, spec.add_dirs
        )
        allowed = GeminiAdapter.settings(None, spec.tools, spec.max_turns)["tools"]["allowed"]
        settings["tools"]["allowed"] = allowed
        write_private(spec.config_file, json.dumps(settings, indent=2))

    def env(self, spec: RunSpec) -> dict[str, str]:
        return self.native_adapter().child_env(spec)


# The prefix of a chat staged for gemini --acp's session/load (see GeminiPreset.stage_resume).
RESUMED_CHAT = "session-resumed-"


def _fullest_chat(kept: Path | None, session_id: str) -> Path | None:
    """The longest kept chat of ``session_id``: a chat only grows as it goes on, and the
    empty recordings session/load leaves behind (see above) are the shortest."""
    if kept is None or not kept.is_dir():
        return None
    chats = []
    for path in kept.glob(f"*/chats/session-*-{session_id[:8]}.json*"):
        with open(path, encoding="utf-8", errors="replace") as fh:
            if session_id in fh.readline():
                chats.append(path)
    return max(chats, key=lambda path: path.stat().st_size, default=None)


def _chat_messages(path: Path) -> list[dict[str, Any]] | None:
    """A Gemini chat file's messages, as Gemini reads them (records by id, in order; a
    ``$set`` of messages starts them over); None when it holds what spawnkit does not
    read (a rewind) or cannot be read."""
    messages: dict[str, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return None
    for record in records:
        if not isinstance(record, dict) or "$rewindTo" in record:
            return None
        update = record.get("$set")
        if isinstance(update, dict) and isinstance(update.get("messages"), list):
            messages = {m["id"]: m for m in update["messages"] if _is_message(m)}
        elif _is_message(record):
            messages[record["id"]] = record
    return list(messages.values())


def _is_message(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("id"), str) and "type" in record


# Parts Gemini's replay shows as a placeholder ("[Function Response: name]"), not as text.
_SHOWN_PARTS = (
    "videoMetadata", "thought", "codeExecutionResult", "executableCode", "fileData",
    "functionCall", "functionResponse", "inlineData",
)  # fmt: skip


def _replayed_updates(message: dict[str, Any]) -> int:
    """The updates Gemini's replay sends for one message of a chat."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [part for part in content if isinstance(part, dict)]
        shown = any(name in part for part in parts for name in _SHOWN_PARTS)
        content = "*" if shown else "".join(str(part.get("text") or "") for part in parts)
    has_text = isinstance(content, str) and bool(content.strip())
    if message["type"] == "user":
        return int(has_text)
    if message["type"] != "gemini":
        return 0
    thoughts, calls = message.get("thoughts") or [], message.get("toolCalls") or []
    return len(thoughts) + int(has_text) + len(calls)


class ClaudeCodePreset(AcpPreset):
    native = "claude-code"
    program = "claude-code-acp"
    install_hint = "npm install -g @zed-industries/claude-code-acp@0.16.2"
    binary_env = "SPAWNKIT_CLAUDE_CODE_ACP"
    system_in_prompt = False
    native_turn_limit = True
    # claude-code-acp 0.16 sends no usage_update and no usage in its prompt's result.
    metered = True
    # Claude Code's built-in tools, those a butler does not list are disallowed.
    BUILTIN = (
        "Bash", "BashOutput", "KillShell", "Read", "Write", "Edit", "MultiEdit", "Glob",
        "Grep", "WebFetch", "WebSearch", "NotebookEdit", "Task", "Agent", "TodoWrite", "Skill",
    )  # fmt: skip

    def native_adapter(self) -> ClaudeCodeAdapter:
        return ClaudeCodeAdapter()

    def env(self, spec: RunSpec) -> dict[str, str]:
        seed_home(spec.workspace)
        env = self.native_adapter().child_env(spec)
        if os.geteuid() == 0:
            # Claude Code refuses its permission bypass as root unless told it is
            # sandboxed, which the run is; claude-code-acp offers that mode only then.
            env["IS_SANDBOX"] = "1"
        return env

    def session_meta(self, spec: RunSpec) -> dict[str, Any]:
        listed = {*spec.tools, *spec.ask}
        options: dict[str, Any] = {
            "maxTurns": spec.max_turns,
            "settingSources": [],
            "disallowedTools": [tool for tool in self.BUILTIN if tool not in listed],
        }
        if spec.model:
            options["model"] = spec.model
        return {"systemPrompt": spec.system_prompt, "claudeCode": {"options": options}}

    def transcript(self, spec: RunSpec, session_id: str) -> Path:
        """Claude Code appends the turn's end to its transcript just after the answer."""
        return (
            spec.workspace
            / ".claude"
            / "projects"
            / project_dir_name(spec.cwd)
            / (f"{session_id}.jsonl")
        )

    def turn_logged(self, last_line: bytes, answer: str) -> bool:
        """Claude Code logs a turn's answer last: an assistant entry of text blocks (no
        tool use) whose text is the answer the prompt streamed."""
        try:
            entry = json.loads(last_line)
        except ValueError:
            return False
        message = entry.get("message") if isinstance(entry, dict) else None
        if entry.get("type") != "assistant" or not isinstance(message, dict):
            return False
        blocks = message.get("content")
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            return False
        if any(block.get("type") != "text" for block in blocks):
            return False
        text = "".join(str(block.get("text") or "") for block in blocks)
        return bool(answer.strip()) and text.strip() == answer.strip()


class CodexPreset(AcpPreset):
    native = "codex"
    program = "codex-acp"
    install_hint = "npm install -g @zed-industries/codex-acp@0.16.0"
    binary_env = "SPAWNKIT_CODEX_ACP"
    system_in_prompt = False
    # Its warning that the replay's unknown model slug has no metadata comes as text.
    noise = ("Model metadata for `",)
    # Its usage_update tells the context window's fill (used, size), not tokens spent.
    metered = True

    def native_adapter(self) -> CodexAdapter:
        return CodexAdapter()

    def command(self, spec: RunSpec, program: str) -> list[str]:
        """The native binary where ``codex-acp`` is Zed's npm launcher (no node start)."""
        native = native_codex_acp(Path(program))
        return super().command(spec, str(native) if native is not None else program)

    def model(self, spec: RunSpec) -> str | None:
        return run_model(spec)

    def build_config_file(self, workspace: Path) -> Path:
        return self.native_adapter().build_config_file(workspace, None)

    def prepare(self, spec: RunSpec) -> None:
        self.native_adapter().write_run_config(spec)
        # Codex asks its client (session/request_permission) instead of refusing alone.
        with open(spec.config_file, "rb") as fh:
            config = tomllib.load(fh)
        config["approval_policy"] = "on-request"
        write_private(spec.config_file, tomli_w.dumps(config))

    def env(self, spec: RunSpec) -> dict[str, str]:
        return self.native_adapter().child_env(spec)


PRESETS: tuple[type[AcpPreset], ...] = (GeminiPreset, ClaudeCodePreset, CodexPreset)


def find_preset(argv: Sequence[str]) -> type[AcpPreset]:
    """The preset for an agent's command line (:class:`AcpPreset` itself when unknown)."""
    return next((preset for preset in PRESETS if preset.matches(argv)), AcpPreset)
