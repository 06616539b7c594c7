"""Redaction: the secret values spawnkit injects into a run stay out of what it keeps and shows.

A :class:`Redactor` is built from ``{NAME: value}`` (the credentials and declared
variables a run receives, never ``PATH``, ``HOME`` and such) and replaces every
occurrence of a value with ``[redacted:NAME]``. The spawner applies one per run at
each boundary, once: its event collector (what listeners and live views get, the
tool calls, the partial output), the results it builds (and so the session record,
``sessions --json`` and the ``trigger`` tool), the run's stdout/stderr logs, the
run's span, and the butler server's ``mcp_calls`` rows. :meth:`Redactor.tree`
rewrites files in place, for transcripts harvested from a CLI's own state.

What counts as an occurrence: the value itself and the forms it commonly takes on
its way through a CLI's output: escaped inside a JSON string (with and without
``\\uXXXX`` escapes, and escaped twice, as JSON text inside a JSON string),
URL-encoded, base64 of the value alone (as ``base64 <<< "$TOKEN"`` prints it), and
each line of a multi-line value (a PEM key printed line by line). Longer forms win
over shorter ones that overlap them. Values shorter than :data:`MIN_SECRET_CHARS`
are left alone: replacing ``1``, ``true`` or ``en`` everywhere would wreck every log
while hiding nothing worth hiding.

The secrets spawnkit itself mints for a run (:data:`RunSecret`: the MCP bearer secret,
the OTLP receiver's secret, a metering relay's secret) are redacted the same way: the
agent can read them (they are in its CLI's configuration or environment) and print
them, and they must not outlive the run in its records. Whoever mints one registers it
with :meth:`Redactor.add_run_secret`, before the CLI starts.

Text that streams in pieces (text deltas) goes through :class:`TextStream`, which
holds back a tail that could be the start of a secret until the next piece shows
whether it is, so a value split across two deltas is still caught.

This is a safety net against accidents (an agent echoing a token, a CLI logging a
header), not a defence against an agent that wants a secret out: one that hashes,
reverses or splits a value defeats any redaction. Keeping secrets from runs that
must not have them is the sandbox's job.
"""

from __future__ import annotations

import base64
import codecs
import functools
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, get_args, overload
from urllib.parse import quote, quote_plus

from .events import (
    AssistantText,
    Finished,
    NetworkDenied,
    PermissionAsked,
    PermissionDecided,
    RunEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from .result import SpawnerResult, ToolCall

MIN_SECRET_CHARS = 8
# Every secret spawnkit mints for one run, by the name its redaction marker shows.
RunSecret = Literal["SPAWNKIT_MCP_SECRET", "SPAWNKIT_OTLP_SECRET", "SPAWNKIT_RELAY_SECRET"]
RUN_SECRETS: tuple[RunSecret, ...] = get_args(RunSecret)
MARKER = "[redacted:{name}]"
# Files are rewritten in chunks of this size (plus a held-back tail), never read whole.
FILE_CHUNK_CHARS = 1024 * 1024


def forms(value: str) -> set[str]:
    """The spellings of ``value`` that are redacted (only those of secret length)."""
    found = {value}
    for text in (value, *value.splitlines()):
        found.add(text.strip())
    for text in list(found):
        for escaped in (json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
            found.add(escaped)
            found.add(json.dumps(escaped, ensure_ascii=False)[1:-1])
        found.add(quote(text, safe=""))
        found.add(quote_plus(text, safe=""))
    raw = value.encode("utf-8")
    whole = len(raw) // 3 * 3  # the part of the encoding that does not depend on what follows
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        found.add(encode(raw[:whole]).decode("ascii"))
    return {text for text in found if len(text) >= MIN_SECRET_CHARS}


# Proper prefixes of forms up to this length are kept in a set, for the stream's hold-back.
_PREFIX_SET_MAX = 256
# Text without any form's first characters skips the regex (no form is shorter).
_ANCHOR_CHARS = 6
# Every character ``str()`` of an int or a float can hold ("-1.5e+20", "inf", "nan"): a
# form with any other character cannot occur in a number's text.
_NUMBER_CHARS = frozenset("0123456789.+-einfa")
assert _ANCHOR_CHARS <= MIN_SECRET_CHARS


class _Patterns:
    """Everything one redaction pass needs, swapped as a whole when secrets are added.

    Only the cheap parts are made at once: a run adds its secrets one by one as it
    mints them, and most texts hold none (:meth:`present` says so without a regex). The
    regex and the stream's hold-back tables are made on the first pass that needs them.
    """

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names  # form -> NAME
        self.forms = tuple(sorted(names, key=lambda form: (-len(form), form)))  # longest first
        self.longest = len(self.forms[0]) if self.forms else 0
        # The distinct openings of the forms, each with the forms that open with it.
        by_anchor: dict[str, list[str]] = {}
        for form in self.forms:
            by_anchor.setdefault(form[:_ANCHOR_CHARS], []).append(form)
        self.anchors = tuple(sorted(by_anchor))
        self.by_anchor = {anchor: tuple(group) for anchor, group in by_anchor.items()}

    def __bool__(self) -> bool:
        return bool(self.forms)

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile("|".join(re.escape(form) for form in self.forms))

    @functools.cached_property
    def starts(self) -> re.Pattern[str]:
        """Any first character of a form."""
        return re.compile(f"[{''.join(re.escape(c) for c in sorted({f[0] for f in self.forms}))}]")

    @functools.cached_property
    def prefixes(self) -> frozenset[str]:
        """The proper prefixes of the forms short enough to keep them all."""
        short = [form for form in self.forms if len(form) <= _PREFIX_SET_MAX]
        return frozenset(form[:k] for form in short for k in range(1, len(form)))

    @functools.cached_property
    def in_numbers(self) -> bool:
        """Whether a form could occur in a number's text (a secret of digits): when none
        can, numbers are left as they are without a scan (telemetry is full of them)."""
        return any(set(form) <= _NUMBER_CHARS for form in self.forms)

    @functools.cached_property
    def long_forms(self) -> tuple[str, ...]:
        """The forms too long for :attr:`prefixes`."""
        return tuple(form for form in self.forms if len(form) > _PREFIX_SET_MAX)

    def present(self, text: str) -> bool:
        """Whether a form occurs in ``text``: a few short substring scans, far cheaper than
        the regex (which runs only when one hits); an opening that is there is confirmed by
        its whole forms, so a text that merely shares a secret's first characters (a key
        named after a word the text holds) does not pay for the regex."""
        by_anchor = self.by_anchor
        return any(
            anchor in text and any(form in text for form in by_anchor[anchor])
            for anchor in self.anchors
        )


_EMPTY = _Patterns({})


class Redactor:
    """Replaces known secret values with ``[redacted:NAME]`` in text, data, events and results.

    A value shared by several names is reported under the first name added. ``add``
    may be called while the redactor is in use (the spawner adds the values it really
    injected once the run's environment is built); each pass sees one consistent set.
    """

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        self._patterns = _EMPTY
        if secrets:
            self.add(secrets)

    def add(self, secrets: Mapping[str, str]) -> None:
        names = dict(self._patterns.names)
        for name, value in secrets.items():
            if len(value) < MIN_SECRET_CHARS:
                continue
            for form in sorted(forms(value)):
                names.setdefault(form, name)
        if len(names) > len(self._patterns.names):
            self._patterns = _Patterns(names)

    def add_run_secret(self, name: RunSecret, value: str) -> str:
        """Redact a secret spawnkit minted for this run (see :data:`RunSecret`); returns
        ``value``, so a mint reads ``secret = redactor.add_run_secret(NAME, mint())``."""
        self.add({name: value})
        return value

    @property
    def names(self) -> list[str]:
        """The names whose values are redacted."""
        return sorted(set(self._patterns.names.values()))

    def __bool__(self) -> bool:
        return bool(self._patterns)

    @property
    def redacts_numbers(self) -> bool:
        """Whether a number can be redacted: only when a secret could be spelled in one."""
        return self._patterns.in_numbers

    def __repr__(self) -> str:  # never the values
        return f"Redactor({', '.join(self.names)})"

    # -- text and data -------------------------------------------------------------

    @overload
    def text(self, text: str) -> str: ...
    @overload
    def text(self, text: None) -> None: ...
    def text(self, text: str | None) -> str | None:
        patterns = self._patterns
        if not patterns or not text or not patterns.present(text):
            return text
        return patterns.regex.sub(lambda m: MARKER.format(name=patterns.names[m[0]]), text)

    def data(self, value: Any) -> Any:
        """``value`` (JSON-like: dicts, lists, strings, numbers) with secrets redacted."""
        if not self:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.data(k): self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.data(v) for v in value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # A plain number's text is digits and such; a subclass's may read otherwise.
            if type(value) in (int, float) and not self.redacts_numbers:
                return value
            redacted = self.text(str(value))
            return value if redacted == str(value) else redacted
        return value

    def call(self, call: ToolCall) -> ToolCall:
        if not self:
            return call
        return replace(call, input=self.data(call.input), output=self.text(call.output))

    def result(self, result: SpawnerResult) -> SpawnerResult:
        if not self:
            return result
        return replace(
            result,
            output=self.text(result.output),
            error=self.text(result.error),
            tool_calls=[self.call(call) for call in result.tool_calls],
            permissions=tuple(
                replace(answer, reason=self.text(answer.reason)) for answer in result.permissions
            ),
        )

    def event(self, event: RunEvent) -> RunEvent:
        """One event, redacted (text deltas are better sent through :meth:`stream`)."""
        if not self:
            return event
        if isinstance(event, TextDelta | AssistantText):
            return replace(event, text=self.text(event.text))
        if isinstance(event, ToolCallStarted | ToolCallFinished):
            return replace(event, call=self.call(event.call))
        if isinstance(event, Finished):
            return replace(event, result=self.result(event.result))
        if isinstance(event, NetworkDenied):  # a secret can be sent out as a host name
            return replace(event, host=self.text(event.host))
        if isinstance(event, PermissionAsked):
            return replace(event, call=self.call(event.call))
        if isinstance(event, PermissionDecided):
            answer = replace(event.answer, reason=self.text(event.answer.reason))
            return replace(event, call=self.call(event.call), answer=answer)
        return event

    def stream(self) -> TextStream:
        return TextStream(self)

    # -- files ---------------------------------------------------------------------

    def file(self, path: Path) -> int:
        """Rewrite the regular file ``path`` with secrets redacted; returns how many.

        The file is replaced atomically (same mode) only if something was redacted.
        Symlinks are left alone: a link could point anywhere. Bytes that are not
        UTF-8 pass through unchanged.
        """
        if not self or not stat.S_ISREG(path.lstat().st_mode):
            return 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        stream, count = self.stream(), 0
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".redacting", dir=path.parent)
        try:
            with (
                open(path, "rb") as source,
                os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape", newline="") as out,
            ):
                while chunk := source.read(FILE_CHUNK_CHARS):
                    out.write(stream.feed(decoder.decode(chunk)))
                    count += stream.replaced
                out.write(stream.feed(decoder.decode(b"", final=True)))
                count += stream.replaced
                out.write(stream.flush())
                count += stream.replaced
            if count:
                Path(tmp).chmod(stat.S_IMODE(path.stat().st_mode))
                Path(tmp).replace(path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return count

    def tree(self, root: Path) -> int:
        """Redact every regular file under ``root`` (symlinks not followed); returns how many."""
        if not self:
            return 0
        count = 0
        for folder, _, files in os.walk(root):
            for name in files:
                count += self.file(Path(folder) / name)
        return count


class TextStream:
    """Redacts text arriving in pieces; a value split across pieces is still caught.

    ``feed`` returns what can safely be shown now; a tail that could be the start of a
    secret waits for the next piece (at most the longest form, minus one character).
    ``flush`` returns whatever is held back.
    """

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self.replaced = 0  # redactions made by the last feed or flush
        self._held = ""

    def feed(self, piece: str) -> str:
        text = self._held + piece
        cut = _safe_cut(text, self.redactor._patterns)
        self._held = text[cut:]
        return self._out(text[:cut])

    def flush(self) -> str:
        text, self._held = self._held, ""
        return self._out(text)

    def _out(self, text: str) -> str:
        patterns = self.redactor._patterns
        if not patterns or not text or not patterns.present(text):
            self.replaced = 0
            return text
        out, self.replaced = patterns.regex.subn(
            lambda m: MARKER.format(name=patterns.names[m[0]]), text
        )
        return out


def _safe_cut(text: str, patterns: _Patterns) -> int:
    """Where ``text`` may be cut so that no secret is split: before a tail that could begin one."""
    if not patterns:
        return len(text)
    held = 0
    # The earliest candidate start gives the longest tail: the first hit is the answer.
    for start in patterns.starts.finditer(text, max(0, len(text) - patterns.longest + 1)):
        tail = text[start.start() :]
        if tail in patterns.prefixes or any(
            len(form) > len(tail) and form.startswith(tail) for form in patterns.long_forms
        ):
            held = len(tail)
            break
    cut = len(text) - held
    if held and patterns.present(text):
        for match in patterns.regex.finditer(text):
            if match.start() < cut < match.end():
                cut = match.end()  # a whole secret straddles the cut: keep it on the safe side
    return cut
