#!/usr/bin/env python3
"""List the birthdays of the next N days, soonest first, with the age when the year is known.

Reads a JSON object on stdin: name -> "YYYY-MM-DD" or "MM-DD", or name -> a person record
with a "birthday" field (what the relationship butler's ``state_list("people/")`` returns).
"Today" is ``--today``, else the current date in ``RELATIONSHIP_TIMEZONE``, else the local
date. A 29 February birthday falls on 28 February in common years. Standard library only.

Exit codes: 0 success, 2 bad input or options (the reason is printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

TIMEZONE_VAR = "RELATIONSHIP_TIMEZONE"
MAX_DAYS = 366
_BIRTHDAY_RE = re.compile(r"^(?:(\d{4})-)?(\d{2})-(\d{2})$")


class InputError(Exception):
    """The input cannot be used; the message says why."""


@dataclass(frozen=True)
class Birthday:
    name: str
    month: int
    day: int
    year: int | None


@dataclass(frozen=True)
class Upcoming:
    birthday: Birthday
    on: date
    days_away: int

    @property
    def age(self) -> int | None:
        return None if self.birthday.year is None else self.on.year - self.birthday.year


def parse_birthday(name: str, raw: str) -> Birthday:
    found = _BIRTHDAY_RE.match(raw.strip())
    if not found:
        raise InputError(f"{name}: birthday must be YYYY-MM-DD or MM-DD, got {raw!r}")
    year = int(found.group(1)) if found.group(1) else None
    month, day = int(found.group(2)), int(found.group(3))
    try:
        date(year if year is not None else 2000, month, day)  # 2000 is a leap year
    except ValueError:
        raise InputError(f"{name}: no such date: {raw!r}") from None
    return Birthday(name, month, day, year)


def birthdays_from_json(data: object) -> list[Birthday]:
    if not isinstance(data, dict):
        raise InputError(
            f"stdin: expected a JSON object of name -> birthday, got {type(data).__name__}"
        )
    birthdays: list[Birthday] = []
    for key, value in data.items():
        if isinstance(value, str):
            birthdays.append(parse_birthday(key, value))
        elif isinstance(value, dict):
            name = str(value.get("name") or key.rsplit("/", 1)[-1])
            raw = value.get("birthday")
            if raw is None or raw == "":
                continue  # a person whose birthday is not known
            if not isinstance(raw, str):
                raise InputError(f"{name}: birthday must be a string, got {json.dumps(raw)}")
            birthdays.append(parse_birthday(name, raw))
        else:
            raise InputError(
                f"{key}: expected a birthday string or a record, got {json.dumps(value)}"
            )
    return birthdays


def occurrence(birthday: Birthday, year: int) -> date:
    try:
        return date(year, birthday.month, birthday.day)
    except ValueError:  # 29 February in a common year
        return date(year, 2, 28)


def upcoming(birthdays: list[Birthday], today: date, days: int) -> list[Upcoming]:
    found: list[Upcoming] = []
    for birthday in birthdays:
        on = occurrence(birthday, today.year)
        if on < today:
            on = occurrence(birthday, today.year + 1)
        away = (on - today).days
        if away <= days:
            found.append(Upcoming(birthday, on, away))
    return sorted(found, key=lambda u: (u.days_away, u.birthday.name.casefold()))


def when(days_away: int) -> str:
    if days_away == 0:
        return "today"
    if days_away == 1:
        return "tomorrow"
    return f"in {days_away} days"


def render(found: list[Upcoming], today: date, days: int) -> str:
    end = today + timedelta(days)
    window = f"in the next {days} days ({today.isoformat()} to {end.isoformat()})"
    if days == 0:
        window = f"today ({today.isoformat()})"
    if not found:
        return f"No birthdays {window}."
    noun = "birthday" if len(found) == 1 else "birthdays"
    lines = [f"{len(found)} {noun} {window}:"]
    for item in found:
        age = item.age
        turns = f" turns {age}" if age is not None and age > 0 else ""
        lines.append(
            f"{item.on.isoformat()} ({item.on.strftime('%a')}, {when(item.days_away)}): "
            f"{item.birthday.name}{turns}"
        )
    return "\n".join(lines)


def default_today(environ: dict[str, str]) -> date:
    zone = environ.get(TIMEZONE_VAR, "").strip()
    if not zone:
        return date.today()
    try:
        return datetime.now(ZoneInfo(zone)).date()
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"{TIMEZONE_VAR}={zone!r} is not a known time zone") from None


def iso_date(raw: str) -> date:
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {raw!r}") from None


def day_count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {raw!r}") from None
    if not 0 <= value <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_DAYS}, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="upcoming.py",
        description="List the birthdays of the next N days, soonest first. Reads a JSON "
        'object on stdin: name -> "YYYY-MM-DD" or "MM-DD", or name -> a record with a '
        '"birthday" field.',
        epilog=f"today defaults to the current date in ${TIMEZONE_VAR} (an IANA zone such "
        "as Europe/Berlin), else the local date.",
    )
    parser.add_argument(
        "--days",
        type=day_count,
        default=30,
        metavar="N",
        help=f"how many days ahead to look, 0 to {MAX_DAYS} (default: 30)",
    )
    parser.add_argument(
        "--today", type=iso_date, metavar="YYYY-MM-DD", help="the day to count from"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if sys.stdin.isatty():
        parser.error("pipe a JSON object of name -> birthday on stdin")
    try:
        text = sys.stdin.read()
        if not text.strip():
            raise InputError("nothing on stdin: expected a JSON object of name -> birthday")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"stdin is not valid JSON: {exc}") from None
        birthdays = birthdays_from_json(data)
        today = args.today or default_today(dict(os.environ))
        print(render(upcoming(birthdays, today, args.days), today, args.days))
    except InputError as exc:
        print(f"upcoming.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
