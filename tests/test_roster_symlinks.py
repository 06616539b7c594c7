"""Nothing a butler is made of may come from outside its roster, symlinks included.

A ``CLAUDE.md``, a shared snippet or anything under ``skills/`` that leads out of the
roster is refused with a RosterError naming the file: when the roster loads, and again
when a run reads it (a link may appear after loading). Links that stay inside are fine.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from spawnkit.config.roster import ButlerConfig, load_roster
from spawnkit.config.system_prompt import compose_system_prompt, read_prompt_file
from spawnkit.errors import RosterError

SECRET = "TOP SECRET, outside the roster"


@pytest.fixture
def roster(tmp_path: Path) -> Path:
    root = tmp_path / "roster"
    folder = root / "health"
    folder.mkdir(parents=True)
    (folder / "butler.toml").write_text(
        textwrap.dedent("""
        [butler]
        name = "health"
        port = 8201
        """)
    )
    (folder / "CLAUDE.md").write_text("You keep health records.")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    (folder / "skill").mkdir(parents=True)
    (folder / "secret.md").write_text(SECRET)
    (folder / "skill" / "SKILL.md").write_text(f"# {SECRET}")
    return folder


def refused(roster: Path) -> RosterError:
    with pytest.raises(RosterError) as caught:
        load_roster(roster)
    assert SECRET not in str(caught.value)
    return caught.value


def assert_names(error: RosterError, path: Path, target: Path) -> None:
    assert error.path == path
    assert str(error).startswith(f"{path}: leads outside the roster, to {target.resolve()}")


def test_a_symlinked_claude_md_is_refused(roster: Path, outside: Path) -> None:
    prompt = roster / "health" / "CLAUDE.md"
    prompt.unlink()
    prompt.symlink_to(outside / "secret.md")
    assert_names(refused(roster), prompt, outside / "secret.md")


def test_a_claude_md_that_becomes_a_link_after_loading_is_refused_when_read(
    roster: Path, outside: Path
) -> None:
    butler = load_roster(roster)["health"]
    butler.system_prompt_file.unlink()
    butler.system_prompt_file.symlink_to(outside / "secret.md")
    with pytest.raises(RosterError) as caught:
        read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    assert_names(caught.value, butler.system_prompt_file, outside / "secret.md")


def test_a_symlinked_shared_snippet_is_refused(roster: Path, outside: Path) -> None:
    butler = load_roster(roster)["health"]
    (roster / "shared").mkdir()
    snippet = roster / "shared" / "BUTLER_SKILLS.md"
    snippet.symlink_to(outside / "secret.md")
    with pytest.raises(RosterError) as caught:
        compose_system_prompt(butler, "base")
    assert_names(caught.value, snippet, outside / "secret.md")


def test_a_shared_folder_linked_out_is_refused(roster: Path, outside: Path) -> None:
    butler = load_roster(roster)["health"]
    (outside / "BUTLER_SKILLS.md").write_text(SECRET)
    (roster / "shared").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RosterError) as caught:
        compose_system_prompt(butler, "base")
    assert_names(caught.value, roster / "shared" / "BUTLER_SKILLS.md", outside / "BUTLER_SKILLS.md")


def test_an_include_through_a_link_out_is_refused(roster: Path, outside: Path) -> None:
    (roster / "shared").mkdir()
    (roster / "shared" / "rules.md").symlink_to(outside / "secret.md")
    (roster / "health" / "CLAUDE.md").write_text("<!-- @include shared/rules.md -->")
    butler = load_roster(roster)["health"]
    with pytest.raises(RosterError, match="include escapes the roster directory"):
        read_prompt_file(butler.system_prompt_file, butler.roster_dir)


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("skills/peek", "skill"),  # a whole skill
        ("skills/notes/SKILL.md", "skill/SKILL.md"),  # a skill's description
        ("skills/notes/data/secret.md", "secret.md"),  # a file deep inside a skill
        ("skills", "."),  # the skills folder itself
    ],
)
def test_a_skill_leading_out_of_the_roster_is_refused(
    roster: Path, outside: Path, link: str, target: str
) -> None:
    (roster / "health" / "skills" / "notes" / "data").mkdir(parents=True)
    (roster / "health" / "skills" / "notes" / "SKILL.md").write_text("# Notes")
    path = roster / "health" / link
    if path.is_dir():
        path.rename(path.with_name("old"))
    elif path.exists():
        path.unlink()
    path.symlink_to(outside / target, target_is_directory=(outside / target).is_dir())
    assert_names(refused(roster), path, outside / target)


def test_links_that_stay_inside_the_roster_are_followed(roster: Path) -> None:
    shared_skill = roster / "shared" / "skills" / "count"
    shared_skill.mkdir(parents=True)
    (shared_skill / "SKILL.md").write_text("# Counts words")
    (roster / "health" / "skills").mkdir()
    (roster / "health" / "skills" / "count").symlink_to(shared_skill, target_is_directory=True)
    (roster / "shared" / "intro.md").write_text("Hello from the roster.")
    prompt = roster / "health" / "CLAUDE.md"
    prompt.unlink()
    prompt.symlink_to(roster / "shared" / "intro.md")
    butler: ButlerConfig = load_roster(roster)["health"]
    assert [p.name for p in butler.skills()] == ["count"]
    composed = compose_system_prompt(
        butler, read_prompt_file(butler.system_prompt_file, butler.roster_dir)
    )
    assert composed.startswith("Hello from the roster.")
    assert "- `skills/count/`: Counts words" in composed
