"""``[butler.runtime] type = "acp"``: its command in butler.toml, its presets, ``doctor``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spawnkit.config.butler_config import RuntimeConfig
from spawnkit.config.roster import RosterError
from spawnkit.doctor import check_acp_agents
from spawnkit.runtimes import get_adapter
from spawnkit.runtimes.acp.presets import (
    RESUMED_CHAT,
    AcpPreset,
    ClaudeCodePreset,
    CodexPreset,
    GeminiPreset,
    find_preset,
)
from spawnkit.runtimes.base import RunSpec

from .conftest import RosterFactory


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('type = "acp"\n', r"needs the agent's command, like \[\"gemini\", \"--acp\"\]"),
        ('type = "acp"\ncommand = "gemini --acp"\n', r"must be a list of strings"),
        ('type = "acp"\ncommand = []\n', r"must name a program"),
        ('type = "acp"\ncommand = ["x"]\noutput = "text"\n', r'type = "acp" takes only command'),
    ],
)
def test_acp_command_errors_are_one_line(
    make_butler: RosterFactory, extra: str, message: str
) -> None:
    with pytest.raises(RosterError, match=message) as caught:
        make_butler("broken", extra="[butler.runtime]\n" + extra)
    assert "\n" not in str(caught.value)


def test_acp_command_is_the_agents_argv(make_butler: RosterFactory) -> None:
    butler = make_butler(extra='[butler.runtime]\ntype = "acp"\ncommand = ["gemini", "--acp"]\n')
    assert butler.runtime.type == "acp"
    assert butler.runtime.acp_command == ("gemini", "--acp")
    assert butler.runtime.command is None


def test_presets_by_command_line() -> None:
    assert find_preset(["gemini", "--acp"]) is GeminiPreset
    assert find_preset(["/opt/bin/gemini", "--experimental-acp"]) is GeminiPreset
    assert find_preset(["gemini"]) is AcpPreset, "gemini without --acp speaks no ACP"
    assert find_preset(["claude-code-acp"]) is ClaudeCodePreset
    assert find_preset(["codex-acp"]) is CodexPreset
    assert find_preset(["goose", "acp"]) is AcpPreset


def test_a_preset_adapter_has_its_native_runtimes_keys_and_relay() -> None:
    acp = get_adapter("acp")
    gemini = acp(RuntimeConfig(type="acp", acp_command=("gemini", "--acp")))
    assert gemini.passthrough_env == get_adapter("gemini").passthrough_env
    assert gemini.model_via_base_url() and gemini.default_api_url
    assert type(gemini.create_worker()) is type(gemini)
    other = acp(RuntimeConfig(type="acp", acp_command=("goose", "acp")))
    assert not other.model_via_base_url() and other.passthrough_env == ()
    assert other.capabilities()["max_turns_enforced_by"].startswith("spawnkit")
    assert gemini.capabilities()["supports_resume"] is True
    claude = acp(RuntimeConfig(type="acp", acp_command=("claude-code-acp",)))
    assert claude.capabilities()["supports_resume"] is True
    # The known agents' model calls are metered by the run's relay; another's cannot be.
    assert gemini.usage_at_end and claude.usage_at_end and not other.usage_at_end


GEMINI_CHAT = Path(__file__).parent / "fixtures" / "runtimes" / "gemini_acp_chat.jsonl"


def test_gemini_replay_is_counted_from_its_chat(tmp_path: Path) -> None:
    """A chat gemini --acp 0.61 recorded (a prompt, an MCP call, the answer): its
    session/load replays 6 updates after answering (checked against the real CLI): the
    context and the prompt, the text, the tool call, its response, the answer."""
    chat = GEMINI_CHAT.read_text()
    session_id = json.loads(chat.splitlines()[0])["sessionId"]
    workspace, cwd = tmp_path / "home", tmp_path / "My Project"
    chats = workspace / ".gemini" / "tmp" / "my-project" / "chats"
    chats.mkdir(parents=True)
    (chats / f"{RESUMED_CHAT}2026-11-28T10-58-{session_id[:8]}.jsonl").write_text(chat)
    spec = RunSpec(
        session_id="s", butler="health", prompt="", system_prompt="", workspace=workspace,
        cwd=cwd, mcp_server=None, config_file=workspace / "settings.json", env={}, max_turns=5,
    )  # fmt: skip
    assert GeminiPreset(["gemini", "--acp"]).replayed(spec, session_id) == 6
    assert GeminiPreset(["gemini", "--acp"]).replayed(spec, "0" * 36) is None  # not staged
    assert AcpPreset(["goose", "acp"]).replayed(spec, session_id) is None
    (chats / f"{RESUMED_CHAT}2026-11-28T10-58-{session_id[:8]}.jsonl").write_text(
        chat + json.dumps({"$rewindTo": "x"}) + "\n"
    )
    assert GeminiPreset(["gemini", "--acp"]).replayed(spec, session_id) is None  # unread


def test_doctor_names_the_agents_install_command(
    make_butler: RosterFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPAWNKIT_CLAUDE_CODE_ACP", str(tmp_path / "nowhere"))
    missing = make_butler(
        "a", extra='[butler.runtime]\ntype = "acp"\ncommand = ["claude-code-acp"]\n'
    )
    other = make_butler("b", extra='[butler.runtime]\ntype = "acp"\ncommand = ["no-such-agent"]\n')
    claude, unknown = check_acp_agents([missing, other])
    assert (
        not claude.found
        and claude.install == "npm install -g @zed-industries/claude-code-acp@0.16.2"
    )
    assert (unknown.runtime, unknown.found) == ("acp:no-such-agent", False)


def test_doctor_cli_lists_an_acp_butlers_agent(make_butler: RosterFactory, tmp_path: Path) -> None:
    make_butler(extra='[butler.runtime]\ntype = "acp"\ncommand = ["codex-acp"]\n')
    roster = str(tmp_path / "roster")
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "doctor", "--roster", roster, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    runtimes = {r["runtime"]: r for r in json.loads(done.stdout)["runtimes"]}
    assert runtimes["acp:codex-acp"]["found"], runtimes
