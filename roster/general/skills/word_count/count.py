#!/usr/bin/env python3
"""Count the lines, words, characters and sentences of a text, with reading time and top words.

The text comes from the files named as arguments, or from stdin. A word is a run of letters
or digits, joined by inner apostrophes or hyphens ("don't", "well-known"); a sentence ends
with ".", "!" or "?" (text after the last one counts as a sentence too); characters count
everything except one final newline. Standard library only.

Exit codes: 0 success, 2 an option was wrong or a file could not be read.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

WORDS_PER_MINUTE = 200
_WORD_RE = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")
_SENTENCE_END_RE = re.compile(r"[.!?]+(?=[\s\"')\]\u201d\u2019]|$)")


class InputError(Exception):
    """A file cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Counts:
    lines: int
    words: int
    characters: int
    sentences: int
    frequencies: Counter[str]

    @property
    def reading_minutes(self) -> int:
        return math.ceil(self.words / WORDS_PER_MINUTE)


def count(text: str) -> Counts:
    body = text[:-1] if text.endswith("\n") else text
    words = _WORD_RE.findall(body)
    ends = list(_SENTENCE_END_RE.finditer(body))
    sentences = len(ends)
    tail = body[ends[-1].end() :] if ends else body
    if _WORD_RE.search(tail):
        sentences += 1
    return Counts(
        lines=body.count("\n") + 1 if body else 0,
        words=len(words),
        characters=len(body),
        sentences=sentences,
        frequencies=Counter(word.casefold() for word in words),
    )


def combine(parts: list[Counts]) -> Counts:
    total: Counter[str] = Counter()
    for part in parts:
        total.update(part.frequencies)
    return Counts(
        lines=sum(p.lines for p in parts),
        words=sum(p.words for p in parts),
        characters=sum(p.characters for p in parts),
        sentences=sum(p.sentences for p in parts),
        frequencies=total,
    )


def top_words(frequencies: Counter[str], n: int) -> list[tuple[str, int]]:
    return sorted(frequencies.items(), key=lambda item: (-item[1], item[0]))[:n]


def render(counts: Counts, top: int) -> str:
    lines = [
        f"lines: {counts.lines}",
        f"words: {counts.words}",
        f"characters: {counts.characters}",
        f"sentences: {counts.sentences}",
        f"reading time: {counts.reading_minutes} min (at {WORDS_PER_MINUTE} words a minute)",
    ]
    if top:
        listed = ", ".join(f"{word} ({n})" for word, n in top_words(counts.frequencies, top))
        lines.append(f"top words: {listed or 'none'}")
    return "\n".join(lines)


def read_file(name: str) -> str:
    path = Path(name)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory") from None
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None


def non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="count.py",
        description="Count lines, words, characters and sentences, with reading time "
        f"(at {WORDS_PER_MINUTE} words a minute) and optionally the most frequent words. "
        "Reads the FILEs, or stdin when none is given.",
        epilog="example: python3 skills/word_count/count.py --top 5 notes.txt",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="UTF-8 text files")
    parser.add_argument(
        "--top",
        type=non_negative,
        default=0,
        metavar="N",
        help="also list the N most frequent words (default: 0)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if not args.files:
            if sys.stdin.isatty():
                parser.error("give FILEs or pipe the text on stdin")
            try:
                text = sys.stdin.buffer.read().decode("utf-8")
            except UnicodeDecodeError:
                raise InputError("stdin: not UTF-8 text") from None
            print(render(count(text), args.top))
            return 0
        parts = [count(read_file(name)) for name in args.files]
    except InputError as exc:
        print(f"count.py: error: {exc}", file=sys.stderr)
        return 2
    if len(parts) == 1:
        print(render(parts[0], args.top))
        return 0
    blocks = [
        f"== {name} ==\n{render(part, args.top)}"
        for name, part in zip(args.files, parts, strict=True)
    ]
    blocks.append(f"== total ==\n{render(combine(parts), args.top)}")
    print("\n\n".join(blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
