"""Third-party imports that cost a lot at import and nothing until used: deferred.

``jsonschema`` (imported by claude-agent-sdk and by mcp, so by every run) imports its
optional format checkers when it is itself imported. Two of them are expensive, and used
only by a schema that asks for their format, which neither the agent SDK nor mcp does.
Both are installed wherever JupyterLab is (``jsonschema[format-nongpl]``, through
jupyter-events and nbformat):

* its IRI checker, ``rfc3987_syntax``, builds some thirty Earley parsers with lark as it
  loads: 2 to 2.5 CPU-s on this project's machines, more than all the rest of a run's
  imports together (``python -X importtime``; jsonschema issue #1428,
  opendatahub-io/notebooks#3532);
* its ``duration`` checker, ``isoduration``, imports ``arrow``, whose locales take about
  0.1 CPU-s to build (5 % of a run's imports).

:func:`defer_iri_syntax` puts a stand-in under ``rfc3987_syntax``'s name before jsonschema
is imported. The stand-in's ``is_valid_syntax``, what jsonschema takes from it, loads the
real module on its first call and hands over to it; so does reading any other name of it,
and from then on the real module is the one imported under that name.
:func:`defer_on_first_use` puts the same kind of stand-in in place of ``arrow``, which
isoduration imports at once and uses only when it checks a duration. What jsonschema
checks, and how, is unchanged; only when the work is done is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

NAME = "rfc3987_syntax"
# jsonschema prefers this one (a regular expression, no parsers) when it is installed.
PREFERRED = "rfc3987"
# Imported by their users for names read only when called (isoduration's ``arrow.get``).
ON_FIRST_USE = ("arrow",)


def defer_iri_syntax() -> None:
    """Put the stand-in in place, if jsonschema has not loaded the real module yet and would
    use it (it is installed, and the regular-expression ``rfc3987`` is not)."""
    if "jsonschema" in sys.modules:
        return
    try:
        if importlib.util.find_spec(PREFERRED) is not None:
            return
    except (ImportError, ValueError):
        return
    _stand_in(NAME, _IriSyntax)


def defer_on_first_use(names: tuple[str, ...] = ON_FIRST_USE) -> None:
    """Put a stand-in in place of each of ``names`` not imported yet (see the module's
    docstring)."""
    for name in names:
        _stand_in(name, _StandIn)


def _stand_in(name: str, kind: type[_StandIn]) -> None:
    if name in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken installation: left to its importers
        return
    if spec is None:
        return
    stand_in = kind(name)
    stand_in.__spec__ = spec  # what find_spec answers while the stand-in is in place
    if spec.submodule_search_locations is not None:  # a package: its submodules import
        stand_in.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = stand_in


class _StandIn(ModuleType):
    """A module until one of its names is read: then the real one is loaded, answers, and
    is the one imported under that name from then on. The import system's own
    :class:`importlib.util.LazyLoader` cannot serve here: an ``import`` statement reads the
    module's ``__spec__``, which loads it there and then."""

    _lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system asks for __file__, __loader__, ...
            raise AttributeError(name)
        return getattr(self._real(), name)

    def _real(self) -> ModuleType:
        with self._lock:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            return importlib.import_module(self.__name__)


class _IriSyntax(_StandIn):
    """``rfc3987_syntax``: jsonschema takes ``is_valid_syntax`` from it at import (``from
    ... import``), so that name must be there without loading anything."""

    def is_valid_syntax(self, term: str, value: str) -> bool:
        return bool(self._real().is_valid_syntax(term, value))
