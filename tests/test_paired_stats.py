"""benchmarks/paired.py: a ratio round by round, its interval and its verdict."""

from __future__ import annotations

import math
import random
import sys

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from paired import paired_ratio, paired_sides


def noisy(rounds: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [1.0 + rng.uniform(-spread, spread) for _ in range(rounds)]


def test_a_steady_overhead_is_found_through_noise_common_to_both_sides() -> None:
    # Each round's runs share the machine's moment: a slow round is slow on both sides.
    base = noisy(15, 0.25, seed=1)
    ours = [b * 1.02 * (1 + 0.01 * math.sin(n)) for n, b in enumerate(base)]
    figure = paired_ratio(ours, base, target=1.05)
    assert 1.0 < figure["ci95"][0] <= figure["median"] <= figure["ci95"][1] < 1.05
    assert figure["verdict"] == "met"


def test_verdicts_missed_and_not_shown() -> None:
    base = noisy(15, 0.25, seed=2)
    assert paired_ratio([b * 1.2 for b in base], base, 1.05)["verdict"] == "missed"
    # Rounds whose own noise straddles the target: neither.
    ours = [b * 1.05 * r for b, r in zip(base, noisy(15, 0.1, seed=3), strict=True)]
    figure = paired_ratio(ours, base, 1.05)
    assert figure["ci95"][0] < 1.05 < figure["ci95"][1]
    assert figure["verdict"] == "not shown"
    assert "verdict" not in paired_ratio(ours, base)  # no target, no verdict


def test_the_interval_is_the_same_for_the_same_rounds() -> None:
    base, ours = noisy(9, 0.2, seed=4), noisy(9, 0.2, seed=5)
    assert paired_ratio(ours, base) == paired_ratio(ours, base)


def test_rounds_must_pair_up() -> None:
    with pytest.raises(ValueError, match="differ"):
        paired_ratio([1.0, 1.1], [1.0])
    with pytest.raises(ValueError, match="no time"):
        paired_ratio([1.0], [0.0])


def test_sides_get_wall_and_cpu_where_every_round_was_counted() -> None:
    walls = {"bare": [1.0, 1.2], "spawnkit": [1.1, 1.3], "other": [0.9, 1.0]}
    cpu = {
        "bare": [(0.5, 0.1), (0.6, 0.1)],
        "spawnkit": [(0.55, 0.12), (0.66, 0.12)],
        "other": [(float("nan"), 0.1), (0.5, 0.1)],  # a round without a cgroup
    }
    figures = paired_sides(walls, cpu, "bare", 1.05)
    assert set(figures) == {"spawnkit", "other"}
    assert figures["spawnkit"]["wall"]["median"] == pytest.approx((1.1 + 1.3 / 1.2) / 2, abs=0.001)
    assert figures["spawnkit"]["cpu"]["median"] == pytest.approx(
        (0.67 / 0.6 + 0.78 / 0.7) / 2, abs=0.001
    )
    assert "cpu" not in figures["other"]
