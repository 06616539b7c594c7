"""What a run no longer does again each time, and that what it keeps is never stale.

A trigger used to read the butler's prompt file (and resolve every path of it), look
PATH through for bwrap, bash and env, and read the sandbox's state files, on every run.
They are now kept, each with a check that costs a ``stat``: these tests change the thing
kept under it (an edit, a symlink turned to lead out of the roster, a program removed, a
state file tampered with) and look that the next run sees the change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spawnkit.config import system_prompt
from spawnkit.config.system_prompt import read_prompt_file
from spawnkit.containment import sandbox
from spawnkit.errors import RosterError


@pytest.fixture
def roster(tmp_path: Path) -> Path:
    root = tmp_path / "roster"
    (root / "health").mkdir(parents=True)
    (root / "shared").mkdir()
    (root / "health" / "CLAUDE.md").write_text("Base.\n<!-- @include shared/part.md -->\n")
    (root / "shared" / "part.md").write_text("Part one.")
    return root


def bump(path: Path) -> None:
    """Make the change visible to a stat even on a coarse clock."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_prompt_file_is_read_once_while_it_is_unchanged(
    roster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real = system_prompt.decode_utf8

    def counted(path: Path, data: bytes) -> str:
        reads.append(path)
        return real(path, data)

    monkeypatch.setattr(system_prompt, "decode_utf8", counted)
    prompt = roster / "health" / "CLAUDE.md"
    first = read_prompt_file(prompt, roster)
    assert read_prompt_file(prompt, roster) == first == "Base.\nPart one.\n"
    assert reads == [prompt], "the second run reads nothing"


def test_an_edited_prompt_or_include_is_read_again(roster: Path) -> None:
    prompt = roster / "health" / "CLAUDE.md"
    assert read_prompt_file(prompt, roster) == "Base.\nPart one.\n"
    (roster / "shared" / "part.md").write_text("Part two.")
    bump(roster / "shared" / "part.md")
    assert read_prompt_file(prompt, roster) == "Base.\nPart two.\n"
    prompt.write_text("New base.\n")
    bump(prompt)
    assert read_prompt_file(prompt, roster) == "New base.\n"


def test_a_kept_prompt_whose_include_now_leads_out_of_the_roster_is_refused(
    roster: Path, tmp_path: Path
) -> None:
    prompt = roster / "health" / "CLAUDE.md"
    assert read_prompt_file(prompt, roster) == "Base.\nPart one.\n"
    outside = tmp_path / "secret.md"
    outside.write_text("Part one.")  # the same text and size: only the path differs
    part = roster / "shared" / "part.md"
    part.unlink()
    part.symlink_to(outside)
    with pytest.raises(RosterError, match="escapes the roster"):
        read_prompt_file(prompt, roster)


def test_a_program_found_before_is_looked_for_again_once_it_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "bwrap-test-tool"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert sandbox.which(program.name, path=str(folder)) == str(program)
    program.unlink()
    assert sandbox.which(program.name, path=str(folder)) is None
    other = tmp_path / "other"
    other.mkdir()
    (other / program.name).write_text("#!/bin/sh\n")
    (other / program.name).chmod(0o755)
    assert sandbox.which(program.name, path=str(other)) == str(other / program.name)


def test_a_tampered_sandbox_state_file_is_written_again(isolated_home: Path) -> None:
    program = b"\x00filter bytes\x01"
    path = sandbox._state_file("test", ".bin", program)
    assert path.read_bytes() == program
    assert sandbox._state_file("test", ".bin", program) == path  # kept: a stat
    path.write_bytes(b"\x00other bytes!\x01")  # the same size
    bump(path)
    assert sandbox._state_file("test", ".bin", program) == path
    assert path.read_bytes() == program
