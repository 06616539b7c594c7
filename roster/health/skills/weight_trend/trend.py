#!/usr/bin/env python3
"""Summarise weight readings: count, min, max, mean and the change per week.

The change per week is the slope of a least-squares line through (day, value), times 7.
Readings come as arguments (evenly spaced, ``--interval`` days apart) or as a JSON list on
stdin: plain numbers, or the ``{"date", "value", "unit"}`` entries the health butler keeps
under ``measurements/weight``, whose dates are used as given. Standard library only.

Exit codes: 0 success, 2 bad input (the reason is printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from datetime import date

DAYS_PER_WEEK = 7


class InputError(Exception):
    """The readings cannot be used; the message says why."""


@dataclass(frozen=True)
class Reading:
    day: float  # days since the first reading
    value: float


@dataclass(frozen=True)
class Trend:
    count: int
    minimum: float
    maximum: float
    mean: float
    span_days: float
    per_week: float | None  # None when all readings fall on one day


def parse_number(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise InputError(f"{where}: expected a number, got {json.dumps(raw)}")
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{where}: not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: not a finite number: {raw!r}")
    return value


def parse_date(raw: object, where: str) -> date:
    if not isinstance(raw, str):
        raise InputError(f"{where}: expected a date string YYYY-MM-DD, got {json.dumps(raw)}")
    try:
        return date.fromisoformat(raw.strip()[:10])
    except ValueError:
        raise InputError(f"{where}: not a date YYYY-MM-DD: {raw!r}") from None


def evenly_spaced(values: list[float], interval: float) -> list[Reading]:
    return [Reading(i * interval, v) for i, v in enumerate(values)]


def readings_from_json(data: object, interval: float) -> tuple[list[Reading], str | None]:
    """Readings and the unit the entries name (None when they name none)."""
    if not isinstance(data, list):
        raise InputError(f"stdin: expected a JSON list, got {type(data).__name__}")
    if all(not isinstance(item, dict) for item in data):
        values = [parse_number(item, f"item {i}") for i, item in enumerate(data)]
        return evenly_spaced(values, interval), None
    dated: list[tuple[date, float]] = []
    units: set[str] = set()
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InputError(f"item {i}: mix of plain numbers and entries; use one or the other")
        if "value" not in item:
            raise InputError(f'item {i}: entry has no "value"')
        if "date" not in item:
            raise InputError(f'item {i}: entry has no "date"')
        dated.append(
            (
                parse_date(item["date"], f"item {i}.date"),
                parse_number(item["value"], f"item {i}.value"),
            )
        )
        if item.get("unit"):
            units.add(str(item["unit"]))
    if len(units) > 1:
        raise InputError(f"entries mix units ({', '.join(sorted(units))}); convert them first")
    dated.sort(key=lambda pair: pair[0])
    first = dated[0][0] if dated else date.today()
    readings = [Reading(float((day - first).days), value) for day, value in dated]
    return readings, units.pop() if units else None


def trend(readings: list[Reading]) -> Trend:
    if not readings:
        raise InputError("no readings given")
    values = [r.value for r in readings]
    days = [r.day for r in readings]
    n = len(readings)
    mean_day = sum(days) / n
    mean_value = sum(values) / n
    spread = sum((d - mean_day) ** 2 for d in days)
    per_week = None
    if spread > 0:
        slope = (
            sum((d - mean_day) * (v - mean_value) for d, v in zip(days, values, strict=True))
            / spread
        )
        per_week = slope * DAYS_PER_WEEK
    return Trend(n, min(values), max(values), mean_value, max(days) - min(days), per_week)


def number(value: float, decimals: int = 2) -> str:
    """At most ``decimals`` decimals, trailing zeros dropped: 72.40 -> 72.4."""
    text = f"{value:.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def render(result: Trend, unit: str) -> str:
    suffix = f" {unit}" if unit else ""
    if result.per_week is None:
        change = "change per week: n/a (needs readings on at least two different days)"
    else:
        rounded = round(result.per_week, 2)
        sign = "+" if rounded > 0 else "-" if rounded < 0 else ""
        change = (
            f"change per week: {sign}{abs(rounded):.2f}{suffix} "
            f"(least-squares fit over {number(result.span_days)} days)"
        )
    return "\n".join(
        [
            f"readings: {result.count}",
            f"min: {number(result.minimum)}{suffix}",
            f"max: {number(result.maximum)}{suffix}",
            f"mean: {number(result.mean)}{suffix}",
            change,
        ]
    )


def positive_days(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of days, got {raw!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trend.py",
        description="Count, min, max, mean and least-squares change per week of weight "
        "readings. Give the readings as arguments, oldest first, or as a JSON list on stdin "
        '(numbers, or entries {"date": "YYYY-MM-DD", "value": 72.4, "unit": "kg"}).',
        epilog="example: python3 skills/weight_trend/trend.py --unit kg 73.1 72.8 72.4",
    )
    parser.add_argument("values", nargs="*", metavar="VALUE", help="a reading, oldest first")
    parser.add_argument(
        "--interval",
        type=positive_days,
        default=7.0,
        metavar="DAYS",
        help="days between readings without dates (default: 7, one a week)",
    )
    parser.add_argument("--unit", default="", help="unit to print, e.g. kg (default: the entries')")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.values:
            values = [parse_number(raw, f"argument {i + 1}") for i, raw in enumerate(args.values)]
            readings, unit = evenly_spaced(values, args.interval), None
        else:
            if sys.stdin.isatty():
                parser.error("give readings as arguments or a JSON list on stdin")
            text = sys.stdin.read()
            if not text.strip():
                raise InputError("no readings: no arguments and nothing on stdin")
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"stdin is not valid JSON: {exc}") from None
            readings, unit = readings_from_json(data, args.interval)
        if args.unit and unit and args.unit != unit:
            raise InputError(f"--unit {args.unit} differs from the entries' unit {unit}")
        print(render(trend(readings), args.unit or unit or ""))
    except InputError as exc:
        print(f"trend.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
