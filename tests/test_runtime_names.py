"""One name per runtime everywhere, with its alias (``claude`` for ``claude-code``) accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spawnkit import get_adapter
from spawnkit.ask import load_config
from spawnkit.config.roster import adhoc_butler
from spawnkit.errors import UnknownRuntimeError
from spawnkit.runtimes import ALIASES, available_runtimes, canonical_runtime

from .conftest import REPO, RosterFactory


def test_the_alias_table_maps_to_registered_runtimes() -> None:
    assert dict(ALIASES) == {"claude": "claude-code"}
    for alias, target in ALIASES.items():
        assert target in available_runtimes() and alias not in available_runtimes()
        assert canonical_runtime(alias) == target
        assert get_adapter(alias) is get_adapter(target)
    for name in available_runtimes():
        assert canonical_runtime(name) == name
    known = r"acp, claude-code \(or claude\), codex, command, gemini"
    with pytest.raises(UnknownRuntimeError, match=known):
        canonical_runtime("claude_code")


def test_a_butler_toml_may_use_the_alias(make_butler: RosterFactory) -> None:
    butler = make_butler(extra='[butler.runtime]\ntype = "claude"\n')
    assert butler.runtime.type == "claude-code"
    assert butler.with_runtime("codex").with_runtime("claude").runtime.type == "claude-code"
    assert adhoc_butler("claude", REPO).runtime.type == "claude-code"


def test_ask_takes_the_alias_and_keeps_user_agents_first() -> None:
    config = load_config(Path("/nonexistent/ask.toml"))
    assert config.agent("claude").name == "claude-code"
    with pytest.raises(UnknownRuntimeError, match="unknown runtime 'gpt'"):
        config.agent("gpt")


def test_the_command_line_says_the_canonical_name() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spawnkit", "adapter", "claude", "capabilities"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runtime"] == "claude-code"
