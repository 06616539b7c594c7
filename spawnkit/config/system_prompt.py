"""Composing a butler's system prompt from ``CLAUDE.md``, includes and shared snippets.

``<!-- @include path/to/file.md -->`` pulls in another file, resolved relative
to the roster directory; includes may nest, but a path that leaves the roster
(``../``, an absolute path, a symlink out) is refused before anything is read, and
so is a prompt file or shared snippet that is itself a symlink out of the roster.
The shared ``BUTLER_SKILLS.md`` and ``MCP_LOGGING.md`` are appended when the
roster has them, followed by a list of the butler's own skills. Memory context
is appended later by the spawner, per run.

A prompt file is read once per process and then kept with what it was read from
(:func:`read_prompt_file`): every run reads it again, and a run should cost a ``stat`` per
file, not a ``realpath`` of each and a read. A file that changed in any way (its contents,
or what its path leads to: an inode, a size, a modification or change time) is read
and checked again, so an edit or a symlink turned to lead outside the roster is seen by
the next run.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from ..errors import RosterError
from .butler_config import SHARED_DIR, ButlerConfig, check_inside, decode_utf8

INCLUDE_RE = re.compile(r"<!--\s*@include\s+(?P<path>[^\s>]+)\s*-->")
SHARED_APPENDICES = ("BUTLER_SKILLS.md", "MCP_LOGGING.md")
MAX_INCLUDE_DEPTH = 8


# What a file was when it was read: (device, inode, size, mtime, ctime), all in ns.
Signature = tuple[int, int, int, int, int]


def _signature(path: Path) -> Signature | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def resolve_includes(
    text: str, source: Path, roster_dir: Path, _depth: int = 0,
    _read: list[Path] | None = None,
) -> str:  # fmt: skip
    """Replace every include directive in ``text`` (read from ``source``); the files
    included are appended to ``_read``."""
    root = roster_dir.resolve()

    def include(match: re.Match[str]) -> str:
        raw = match.group("path")
        if _depth >= MAX_INCLUDE_DEPTH:
            raise RosterError(source, f"includes nested deeper than {MAX_INCLUDE_DEPTH}: {raw}")
        if Path(raw).is_absolute():
            raise RosterError(source, f"include path must be relative to the roster: {raw}")
        if _read is not None:
            _read.append(root / raw)
        target = (root / raw).resolve()
        if not target.is_relative_to(root):
            raise RosterError(source, f"include escapes the roster directory: {raw}")
        try:
            included = target.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RosterError(source, f"included file not found: {raw}") from None
        except IsADirectoryError:
            raise RosterError(source, f"include names a directory: {raw}") from None
        except UnicodeDecodeError as exc:
            raise RosterError(
                source, f"included file is not UTF-8 text: {raw} ({exc.reason})"
            ) from None
        return resolve_includes(included, target, root, _depth + 1, _read).rstrip("\n")

    return INCLUDE_RE.sub(include, text)


_read_before: dict[tuple[Path, Path], tuple[tuple[tuple[Path, Signature | None], ...], str]] = {}
_read_lock = threading.Lock()


def read_prompt_file(path: Path, roster_dir: Path) -> str:
    """The prompt file with its includes resolved; it must lie inside ``roster_dir``.

    Kept after the first read; read and checked again once any file it was made of changed.
    """
    key = (path, roster_dir)
    with _read_lock:
        kept = _read_before.get(key)
    if kept is not None and all(_signature(file) == was for file, was in kept[0]):
        return kept[1]
    files = [path]
    before = _signature(path)
    try:
        text = decode_utf8(path, check_inside(path, roster_dir).read_bytes())
    except FileNotFoundError:
        raise RosterError(path, "file not found") from None
    composed = resolve_includes(text, path, roster_dir, _read=files)
    signatures = ((path, before), *((file, _signature(file)) for file in files[1:]))
    if before is not None and _signature(path) == before:  # unchanged while it was read
        with _read_lock:
            _read_before[key] = (signatures, composed)
    return composed


def skills_section(butler: ButlerConfig) -> str | None:
    """A short list of the butler's skills with where to find them."""
    skills = butler.skills()
    if not skills:
        return None
    lines = ["## Your skills", ""]
    for skill in skills:
        summary = ""
        doc = skill / "SKILL.md"
        if doc.is_file():  # butler.skills() has checked where it leads
            first = next(
                (
                    ln.strip("# ").strip()
                    for ln in doc.read_text("utf-8").splitlines()
                    if ln.strip()
                ),
                "",
            )
            summary = f": {first}" if first else ""
        lines.append(f"- `{skill.relative_to(butler.directory)}/`{summary}")
    return "\n".join(lines)


def compose_system_prompt(butler: ButlerConfig, base: str) -> str:
    """``base`` (the parsed ``CLAUDE.md``) plus shared appendices and the skills list."""
    parts = [base.strip()]
    shared = butler.roster_dir / SHARED_DIR
    for name in SHARED_APPENDICES:
        path = shared / name
        if path.is_file():
            parts.append(read_prompt_file(path, butler.roster_dir).strip())
    skills = skills_section(butler)
    if skills:
        parts.append(skills)
    return "\n\n".join(part for part in parts if part)


def append_memory(system_prompt: str, memory_context: str | None) -> str:
    if not memory_context or not memory_context.strip():
        return system_prompt
    return f"{system_prompt}\n\n{memory_context.strip()}"
