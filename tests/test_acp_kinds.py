"""The one table from spawnkit's tool names to ACP's words (both directions use it)."""

from __future__ import annotations

import pytest

from spawnkit.runtimes.acp.kinds import acp_status, spawnkit_status, tool_kind, tool_locations


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Edit", "edit"), ("Write", "edit"), ("replace", "edit"), ("file_change", "edit"),
        ("Read", "read"), ("read_file", "read"), ("Bash", "execute"), ("shell", "execute"),
        ("run_shell_command", "execute"), ("Grep", "search"), ("WebFetch", "fetch"),
        ("mcp__health__state_get", "other"), ("SomethingNew", "other"),
    ],
)  # fmt: skip
def test_each_cli_tool_has_the_kind_of_what_it_does(name: str, kind: str) -> None:
    assert tool_kind(name) == kind


def test_locations_are_the_paths_the_input_names() -> None:
    assert tool_locations({"file_path": "/w/a.py", "old_string": "x"}) == ["/w/a.py"]
    assert tool_locations({"absolute_path": "/w/b.md"}) == ["/w/b.md"]
    assert tool_locations({"command": "ls", "path": ""}) == []


def test_statuses_go_both_ways() -> None:
    for status in ("running", "ok", "error"):
        assert spawnkit_status(acp_status(status)) == status  # type: ignore[arg-type]
    assert spawnkit_status("pending") == "running"
    assert spawnkit_status(None) == "running"
