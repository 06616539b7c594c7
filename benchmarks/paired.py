"""A side's figure against its baseline, round by round, with how sure it is.

The ratio of two medians says nothing of its own noise: on two shared cores a CLI run's
wall time moves by 20 % from one round to the next, and a ratio of medians of 15 rounds
moves by several percent from one benchmark run to the next. Rounds alternate the sides,
so each round's ratio compares runs made moments apart; their median, with a bootstrap
95 % interval over rounds, says whether a target such as "at most 1.05" is met (the
interval's top is below it), missed (its bottom is above it), or not shown either way.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

RESAMPLES = 4000


def paired_ratio(ours: Sequence[float], base: Sequence[float], target: float | None = None
                 ) -> dict[str, Any]:  # fmt: skip
    """The median of ``ours[i] / base[i]`` over rounds, its bootstrap 95 % interval, and,
    given a ``target`` (at most), the verdict: "met", "missed" or "not shown"."""
    if len(ours) != len(base) or not ours:
        raise ValueError(f"paired_ratio: rounds on each side differ: {len(ours)}, {len(base)}")
    if min(base) <= 0:
        raise ValueError("paired_ratio: a baseline round took no time")
    ratios = [a / b for a, b in zip(ours, base, strict=True)]
    rng = random.Random(0)  # the same rounds give the same interval
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES)
    )
    low, high = medians[int(0.025 * RESAMPLES)], medians[int(0.975 * RESAMPLES) - 1]
    figure: dict[str, Any] = {
        "median": round(statistics.median(ratios), 3),
        "ci95": [round(low, 3), round(high, 3)],
        "rounds": len(ratios),
    }
    if target is not None:
        figure["target"] = target
        figure["verdict"] = "met" if high <= target else "missed" if low > target else "not shown"
    return figure


def paired_sides(
    walls: dict[str, Sequence[float]],
    cpu: dict[str, Sequence[tuple[float, float]]],
    base: str,
    target: float,
) -> dict[str, dict[str, Any]]:
    """Each side's :func:`paired_ratio` against ``base``: of wall time, and of all the CPU a
    round's run cost (the CLI's processes and this process, where a cgroup counted them)."""
    figures: dict[str, dict[str, Any]] = {}
    base_cpu = [children + own for children, own in cpu.get(base, ())]
    for side, ours in walls.items():
        if side == base or not ours:
            continue
        figure = {"wall": paired_ratio(ours, walls[base], target)}
        side_cpu = [children + own for children, own in cpu.get(side, ())]
        counted = side_cpu and base_cpu and all(x == x for x in side_cpu + base_cpu)  # no NaN
        if counted:
            figure["cpu"] = paired_ratio(side_cpu, base_cpu, target)
        figures[side] = figure
    return figures
