"""Where a roster is found (--roster, $SPAWNKIT_ROSTER, ./roster, $SPAWNKIT_HOME/roster) and
``spawnkit init``, which makes one that runs offline at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spawnkit.config.roster import load_roster
from spawnkit.config.roster_location import RosterNotFound, find_roster
from spawnkit.config.scaffold import init_roster
from spawnkit.errors import ConfigError

from .conftest import REPO


def spawnkit(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spawnkit", *args],
        capture_output=True, text=True, timeout=180, check=False, cwd=cwd,
        env={**os.environ, **env},
    )  # fmt: skip


def roster_at(path: Path) -> Path:
    init_roster(path)
    return path


def test_the_order_of_the_places(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    in_home = roster_at(isolated_home / "roster")
    assert find_roster() == in_home
    here = roster_at(tmp_path / "roster")
    assert find_roster() == here
    named = roster_at(tmp_path / "named")
    monkeypatch.setenv("SPAWNKIT_ROSTER", str(named))
    assert find_roster() == named
    flag = roster_at(tmp_path / "flag")
    assert find_roster(flag) == flag


def test_a_named_place_that_does_not_exist_is_an_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    roster_at(tmp_path / "roster")
    with pytest.raises(RosterNotFound, match=r"--roster \(.*typo\)"):
        find_roster(tmp_path / "typo")
    monkeypatch.setenv("SPAWNKIT_ROSTER", str(tmp_path / "typo2"))
    with pytest.raises(RosterNotFound, match=r"\$SPAWNKIT_ROSTER \(.*typo2\)"):
        find_roster()


def test_not_found_lists_every_place_and_suggests_init(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RosterNotFound) as info:
        find_roster()
    message = str(info.value)
    assert f"./roster ({tmp_path / 'roster'})" in message
    assert f"$SPAWNKIT_HOME/roster ({isolated_home / 'roster'})" in message
    assert "spawnkit init" in message
    assert [label for label, _ in info.value.looked] == ["./roster", "$SPAWNKIT_HOME/roster"]


def test_init_makes_a_butler_a_skill_and_a_scenario(tmp_path: Path) -> None:
    made = init_roster(tmp_path / "mine")
    roster = load_roster(made.directory)
    butler = roster[made.butler]
    assert [skill.name for skill in butler.skills()] == ["word_count"]
    assert made.scenario.is_file() and made.scenario.is_relative_to(butler.directory)
    assert (made.directory / "shared" / "BUTLER_SKILLS.md").is_file()
    with pytest.raises(ConfigError, match="not an empty folder"):
        init_roster(made.directory)
    (tmp_path / "empty").mkdir()
    assert init_roster(tmp_path / "empty").butler == made.butler


@pytest.mark.e2e
def test_from_an_empty_folder_init_roster_and_an_offline_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    made = spawnkit("init", cwd=work)
    assert made.returncode == 0, made.stderr
    assert "spawnkit run --butler general --replay roster/general/scenarios/assistant.toml" in (
        made.stdout
    )
    listing = spawnkit("roster", cwd=work)
    assert listing.returncode == 0, listing.stderr
    assert f"roster {work / 'roster'}: 1 butler(s)" in listing.stdout
    # The command init printed, as printed.
    command = next(line.strip() for line in made.stdout.splitlines() if "spawnkit run" in line)
    done = subprocess.run(
        command.replace("spawnkit", f"{sys.executable} -m spawnkit", 1), shell=True,
        capture_output=True, text=True, timeout=180, check=False, cwd=work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "words: 6" in done.stdout and "✓ success" in done.stdout


def test_the_example_roster_ships_with_the_package() -> None:
    from spawnkit.config.roster_location import example_roster

    assert (example_roster() / "health" / "scenarios" / "demo.toml").is_file()
    assert example_roster().resolve() in (
        (REPO / "roster").resolve(),
        (Path(__import__("spawnkit").__file__).parent / "_examples" / "roster").resolve(),
    )
