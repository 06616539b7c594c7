"""Composing a butler's system prompt: includes, shared appendices, skills and memory.

Includes are resolved against real files under ``tmp_path``; every path that would read
outside the roster (``../``, an absolute path, a symlink out) must be refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spawnkit.config.system_prompt import (
    MAX_INCLUDE_DEPTH,
    append_memory,
    compose_system_prompt,
    read_prompt_file,
    resolve_includes,
)
from spawnkit.errors import RosterError

from .conftest import RosterFactory


def write(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


@pytest.fixture
def roster(tmp_path: Path) -> Path:
    root = tmp_path / "roster"
    root.mkdir()
    return root


def resolve(roster: Path, text: str) -> str:
    return resolve_includes(text, roster / "health" / "CLAUDE.md", roster)


def include_error(roster: Path, text: str) -> RosterError:
    with pytest.raises(RosterError) as info:
        resolve(roster, text)
    return info.value


# -- includes ------------------------------------------------------------------------------


def test_text_without_includes_is_unchanged(roster: Path) -> None:
    text = "Plain.\n<!-- a comment -->\n<!-- @includes nothing -->\n"
    assert resolve(roster, text) == text


def test_simple_include(roster: Path) -> None:
    write(roster, {"shared/STYLE.md": "Be brief.\n\n"})
    assert resolve(roster, "Intro\n<!-- @include shared/STYLE.md -->\nEnd") == (
        "Intro\nBe brief.\nEnd"
    ), "the included text replaces the directive, its trailing newlines dropped"


def test_directive_with_extra_spaces(roster: Path) -> None:
    write(roster, {"shared/A.md": "alpha"})
    assert resolve(roster, "<!--   @include    shared/A.md   -->") == "alpha"
    assert resolve(roster, "<!--@include shared/A.md-->") == "alpha"


def test_multiple_includes_on_one_line_and_repeated(roster: Path) -> None:
    write(roster, {"shared/A.md": "alpha\n", "shared/B.md": "beta\n"})
    text = "<!-- @include shared/A.md --> and <!-- @include shared/B.md -->\n"
    text += "again: <!-- @include shared/A.md -->"
    assert resolve(roster, text) == "alpha and beta\nagain: alpha"


def test_nested_include_paths_are_relative_to_the_roster(roster: Path) -> None:
    write(
        roster,
        {
            # Written relative to the roster, not to shared/outer.md's own folder.
            "shared/outer.md": "outer[<!-- @include shared/inner/deep.md -->]",
            "shared/inner/deep.md": "deep[<!-- @include health/notes.md -->]",
            "health/notes.md": "notes",
            "shared/shared/inner/deep.md": "WRONG: resolved relative to the including file",
        },
    )
    assert resolve(roster, "<!-- @include shared/outer.md -->") == "outer[deep[notes]]"


def test_include_depth_limit(roster: Path) -> None:
    chain = {f"c/{i}.md": f"{i}<!-- @include c/{i + 1}.md -->" for i in range(MAX_INCLUDE_DEPTH)}
    chain[f"c/{MAX_INCLUDE_DEPTH}.md"] = "end"
    write(roster, chain)
    # CLAUDE.md -> c/0 -> ... -> c/{MAX-1}: MAX levels of nesting are allowed.
    expected = "".join(str(i) for i in range(MAX_INCLUDE_DEPTH))
    assert resolve(roster, "<!-- @include c/1.md -->") == expected[1:] + "end"
    error = include_error(roster, "<!-- @include c/0.md -->")
    assert str(error) == (
        f"{(roster / 'c' / f'{MAX_INCLUDE_DEPTH - 1}.md').resolve()}: includes nested deeper "
        f"than {MAX_INCLUDE_DEPTH}: c/{MAX_INCLUDE_DEPTH}.md"
    )


def test_include_cycle_stops_at_the_depth_limit(roster: Path) -> None:
    write(
        roster,
        {"a.md": "a<!-- @include b.md -->", "b.md": "b<!-- @include a.md -->"},
    )
    error = include_error(roster, "<!-- @include a.md -->")
    assert f"includes nested deeper than {MAX_INCLUDE_DEPTH}" in str(error)
    assert error.path in {(roster / "a.md").resolve(), (roster / "b.md").resolve()}


def test_missing_include_names_the_including_file_and_the_path(roster: Path) -> None:
    write(roster, {"shared/outer.md": "x <!-- @include shared/gone.md -->"})
    error = include_error(roster, "<!-- @include shared/outer.md -->")
    outer = (roster / "shared" / "outer.md").resolve()
    assert error.path == outer
    assert str(error) == f"{outer}: included file not found: shared/gone.md"


def test_missing_include_at_top_level_names_the_prompt_file(roster: Path) -> None:
    error = include_error(roster, "<!-- @include nope.md -->")
    assert str(error) == f"{roster / 'health' / 'CLAUDE.md'}: included file not found: nope.md"


def test_include_escaping_with_dotdot(roster: Path) -> None:
    (roster.parent / "secret.md").write_text("TOP SECRET")
    error = include_error(roster, "<!-- @include ../secret.md -->")
    assert str(error) == (
        f"{roster / 'health' / 'CLAUDE.md'}: include escapes the roster directory: ../secret.md"
    )
    error = include_error(roster, "<!-- @include shared/../../secret.md -->")
    assert "escapes the roster" in str(error) and "TOP SECRET" not in str(error)


def test_include_dotdot_that_stays_inside_is_allowed(roster: Path) -> None:
    write(roster, {"shared/A.md": "alpha"})
    assert resolve(roster, "<!-- @include health/../shared/A.md -->") == "alpha"


def test_absolute_include_path(roster: Path) -> None:
    write(roster, {"shared/A.md": "alpha"})
    absolute = (roster / "shared" / "A.md").resolve()
    error = include_error(roster, f"<!-- @include {absolute} -->")
    assert str(error) == (
        f"{roster / 'health' / 'CLAUDE.md'}: include path must be relative to the roster: "
        f"{absolute}"
    ), "an absolute path is refused even when it points inside the roster"


def test_symlink_out_of_the_roster_is_refused(roster: Path) -> None:
    outside = roster.parent / "outside.md"
    outside.write_text("TOP SECRET")
    (roster / "shared").mkdir()
    (roster / "shared" / "link.md").symlink_to(outside)
    error = include_error(roster, "<!-- @include shared/link.md -->")
    assert str(error).endswith("include escapes the roster directory: shared/link.md")


def test_symlinked_directory_out_of_the_roster_is_refused(roster: Path) -> None:
    outside = roster.parent / "elsewhere"
    outside.mkdir()
    (outside / "x.md").write_text("TOP SECRET")
    (roster / "linked").symlink_to(outside, target_is_directory=True)
    error = include_error(roster, "<!-- @include linked/x.md -->")
    assert "escapes the roster" in str(error)


def test_symlink_inside_the_roster_is_followed(roster: Path) -> None:
    write(roster, {"shared/A.md": "alpha"})
    (roster / "health").mkdir()
    (roster / "health" / "alias.md").symlink_to(roster / "shared" / "A.md")
    assert resolve(roster, "<!-- @include health/alias.md -->") == "alpha"


def test_include_of_a_directory(roster: Path) -> None:
    (roster / "shared").mkdir()
    error = include_error(roster, "<!-- @include shared -->")
    assert str(error) == f"{roster / 'health' / 'CLAUDE.md'}: include names a directory: shared"


def test_read_prompt_file_resolves_includes(roster: Path) -> None:
    write(roster, {"health/CLAUDE.md": "Hi\n<!-- @include shared/A.md -->\n", "shared/A.md": "a"})
    assert read_prompt_file(roster / "health" / "CLAUDE.md", roster) == "Hi\na\n"


def test_read_prompt_file_missing(roster: Path) -> None:
    with pytest.raises(RosterError) as info:
        read_prompt_file(roster / "health" / "CLAUDE.md", roster)
    assert str(info.value) == f"{roster / 'health' / 'CLAUDE.md'}: file not found"


def test_read_prompt_file_not_utf8(roster: Path) -> None:
    path = roster / "CLAUDE.md"
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(RosterError) as info:
        read_prompt_file(path, roster)
    assert str(info.value) == f"{path}: not UTF-8 text (byte 0xe9 at offset 3): save it as UTF-8"


def test_included_file_not_utf8_is_a_roster_error(roster: Path) -> None:
    write(roster, {"health/CLAUDE.md": "<!-- @include shared/latin1.md -->"})
    (roster / "shared" / "latin1.md").parent.mkdir(exist_ok=True)
    (roster / "shared" / "latin1.md").write_bytes(b"caf\xe9\n")
    with pytest.raises(RosterError, match=r"latin1\.md"):
        read_prompt_file(roster / "health" / "CLAUDE.md", roster)


# -- composing -----------------------------------------------------------------------------


def test_compose_appends_shared_files_in_order(make_butler: RosterFactory) -> None:
    butler = make_butler(
        files={
            "shared/MCP_LOGGING.md": "\nLOGGING <!-- @include shared/NOTE.md -->\n\n",
            "shared/BUTLER_SKILLS.md": "SKILLS\n",
            "shared/NOTE.md": "(note)",
            "shared/OTHER.md": "never appended",
        }
    )
    assert compose_system_prompt(butler, "\n  BASE\n\n") == ("BASE\n\nSKILLS\n\nLOGGING (note)")


def test_compose_skips_absent_shared_files(make_butler: RosterFactory) -> None:
    butler = make_butler(files={"shared/MCP_LOGGING.md": "LOGGING"})
    assert compose_system_prompt(butler, "BASE") == "BASE\n\nLOGGING"


def test_compose_lists_skills_with_the_first_line_of_skill_md(
    make_butler: RosterFactory,
) -> None:
    butler = make_butler(
        files={
            "shared/BUTLER_SKILLS.md": "SKILLS",
            "health/skills/weight_trend/SKILL.md": "\n\n# Weight trend per week\n\nMore.",
            "health/skills/bmi/SKILL.md": "Body mass index\nsecond line",
            "health/skills/raw/run.py": "print(1)",
            "health/skills/blank/SKILL.md": "\n  \n",
        }
    )
    assert compose_system_prompt(butler, "BASE") == (
        "BASE\n\nSKILLS\n\n## Your skills\n\n"
        "- `skills/blank/`\n"
        "- `skills/bmi/`: Body mass index\n"
        "- `skills/raw/`\n"
        "- `skills/weight_trend/`: Weight trend per week"
    )


def test_compose_with_nothing_but_the_base(make_butler: RosterFactory) -> None:
    assert compose_system_prompt(make_butler(), "Only me.") == "Only me."


def test_compose_refuses_an_appendix_that_escapes(make_butler: RosterFactory) -> None:
    butler = make_butler(files={"shared/BUTLER_SKILLS.md": "<!-- @include ../../x.md -->"})
    with pytest.raises(RosterError) as info:
        compose_system_prompt(butler, "BASE")
    assert str(info.value) == (
        f"{butler.roster_dir / 'shared' / 'BUTLER_SKILLS.md'}: "
        "include escapes the roster directory: ../../x.md"
    )


# -- memory --------------------------------------------------------------------------------


def test_append_memory_after_one_blank_line() -> None:
    assert append_memory("PROMPT", "## Memory\n- one") == "PROMPT\n\n## Memory\n- one"
    assert append_memory("PROMPT", "\n\n  remembered  \n\n") == "PROMPT\n\nremembered"


@pytest.mark.parametrize("context", [None, "", "   ", "\n\t\n"])
def test_append_memory_ignores_empty_context(context: str | None) -> None:
    assert append_memory("PROMPT", context) == "PROMPT"


def test_composed_prompt_with_memory(make_butler: RosterFactory) -> None:
    butler = make_butler(files={"shared/BUTLER_SKILLS.md": "SKILLS"})
    prompt = append_memory(compose_system_prompt(butler, "BASE\n"), "MEMORY\n")
    assert prompt == "BASE\n\nSKILLS\n\nMEMORY"
