"""The IRI check jsonschema imports (2 CPU-s of parser building) is built when first used.

Each case is a fresh interpreter: what a process has imported is the point.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("rfc3987_syntax")  # installed with JupyterLab (jsonschema[format-nongpl])

IRIS = ["http://example.com/ü", "not an iri", "https://[::1]:80/a?b#c", "", "ftp://x y"]
CHECK = f"""
import json, sys
import jsonschema
checker = jsonschema.Draft7Validator.FORMAT_CHECKER
loaded = "lark" in sys.modules
verdicts = {{f: [checker.conforms(v, f) for v in {IRIS!r}] for f in ("iri", "iri-reference")}}
print(json.dumps({{"lark_at_import": loaded, "verdicts": verdicts,
                   "real": type(sys.modules["rfc3987_syntax"]).__name__ == "module"}}))
"""


def run(prelude: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", prelude + CHECK], capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    return dict(json.loads(done.stdout))


def test_importing_spawnkit_defers_the_parsers_and_the_verdicts_are_the_same() -> None:
    plain = run("")
    deferred = run("import spawnkit\n")
    assert plain["lark_at_import"] is True, "jsonschema itself builds the parsers on import"
    assert deferred["lark_at_import"] is False
    assert deferred["verdicts"] == plain["verdicts"]
    assert True in plain["verdicts"]["iri"] and False in plain["verdicts"]["iri"]  # type: ignore[index]
    assert deferred["real"] is True, "the first check put the real module in its place"


def test_a_process_that_loaded_jsonschema_first_is_left_as_it_is() -> None:
    already = run("import jsonschema, spawnkit\n")
    assert already["lark_at_import"] is True and already["real"] is True


def test_the_stand_in_answers_any_other_name_from_the_real_module() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import spawnkit, rfc3987_syntax as r, sys\n"
         "print(r.RFC3987_SYNTAX_PARSER_TYPE, type(sys.modules['rfc3987_syntax']).__name__)"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["earley", "module"]


DURATIONS = ["P1D", "PT1H30M", "P1Y2M", "1 day", "P", "P2020-01-01T00:00:00"]
DURATION_CHECK = f"""
import json, sys
import jsonschema
checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
built = "arrow.locales" in sys.modules
verdicts = [checker.conforms(v, "duration") for v in {DURATIONS!r}]
print(json.dumps({{"locales_at_import": built, "verdicts": verdicts,
                   "locales_after": "arrow.locales" in sys.modules}}))
"""


def test_arrow_loads_when_a_duration_is_first_checked_with_the_same_verdicts() -> None:
    pytest.importorskip("isoduration")
    plain = run_code(DURATION_CHECK)
    deferred = run_code("import spawnkit\n" + DURATION_CHECK)
    assert plain["locales_at_import"] is True, "isoduration imports arrow, which builds them"
    assert deferred["locales_at_import"] is False
    assert deferred["verdicts"] == plain["verdicts"]
    assert True in plain["verdicts"] and False in plain["verdicts"]  # type: ignore[operator]
    assert deferred["locales_after"] is True


def test_arrow_imported_after_spawnkit_works_as_ever() -> None:
    pytest.importorskip("arrow")
    done = run_code(
        "import spawnkit, arrow, json\n"
        "import arrow.locales\n"  # a submodule, through the stand-in's __path__
        "print(json.dumps({'year': arrow.get('2020-01-02T03:04:05Z').year,"
        " 'class': type(arrow.Arrow).__name__, 'locale': arrow.locales.EnglishLocale.names[0]}))"
    )
    assert done == {"year": 2020, "class": "type", "locale": "en"}


def run_code(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return dict(json.loads(done.stdout))
