"""What pyproject.toml promises holds: the agent SDK is pinned to a tested range (its wheel
bundles the Claude Code the benchmarks and docs name), and the README sections it points
readers to exist."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version

from packaging.requirements import Requirement

from .conftest import REPO

PYPROJECT = REPO / "pyproject.toml"


def test_the_agent_sdk_is_pinned_to_a_range_that_holds_the_installed_one() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (sdk,) = [Requirement(d) for d in dependencies if d.startswith("claude-agent-sdk")]
    assert any(spec.operator == "<" for spec in sdk.specifier), f"{sdk} has no upper bound"
    assert sdk.specifier.contains(version("claude-agent-sdk")), (sdk, version("claude-agent-sdk"))


def test_the_readme_sections_pyproject_names_exist() -> None:
    named = re.findall(r'README: "([^"]+)"', PYPROJECT.read_text())
    assert named, "pyproject.toml names no README section"
    headings = {
        line.lstrip("#").strip()
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("#")
    }
    assert set(named) <= headings, set(named) - headings
