"""Old import paths of moved modules keep working for one release, with a warning.

:mod:`spawnkit._moved` maps each old path to the new one: importing the old path gives
the very module at the new path (one object, so a monkeypatch through either name is
seen through both) and a DeprecationWarning that names the new path and points at the
importing line.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from collections.abc import Iterator

import pytest

from spawnkit import _moved


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An old path that moved to spawnkit.result, for this test only."""
    name = "spawnkit._moved_probe"
    monkeypatch.setitem(_moved.MOVED, name, "spawnkit.result")
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name
    sys.modules.pop(name, None)


def test_an_old_path_is_the_new_module_with_a_warning(probe: str) -> None:
    moved = r"spawnkit\._moved_probe moved to spawnkit\.result"
    with pytest.warns(DeprecationWarning, match=moved):
        old = importlib.import_module(probe)
    assert old is importlib.import_module("spawnkit.result")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # imported once: no second warning
        assert importlib.import_module(probe) is old


def test_the_warning_points_at_the_importing_line(probe: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(f"import {probe}\n", "user_script.py", "exec"), {})
    assert [w.filename for w in caught] == ["user_script.py"], [str(w) for w in caught]


def test_a_name_that_never_existed_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("spawnkit.no_such_module")


@pytest.mark.parametrize(("old", "new"), sorted(_moved.MOVED.items()) or [("-", "-")])
def test_every_moved_path_imports_in_a_fresh_interpreter(old: str, new: str) -> None:
    if old == "-":
        pytest.skip("nothing has moved")
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('error')\n"
        f"new = importlib.import_module({new!r})\n"
        "try:\n"
        f"    importlib.import_module({old!r})\n"
        "except DeprecationWarning as w:\n"
        "    print(w)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"moved to {new}" in out.stdout, out.stdout + out.stderr
