"""A third-party import that costs seconds at import and nothing until used: deferred.

``jsonschema`` (imported by claude-agent-sdk and by mcp, so by every run) imports its IRI
format checker, ``rfc3987_syntax``, when it is itself imported. That module builds some
thirty Earley parsers with lark as it loads: 2 to 2.5 CPU-s on this project's machines,
more than all the rest of a run's imports together (``python -X importtime``; jsonschema
issue #1428, opendatahub-io/notebooks#3532). It is installed wherever JupyterLab is
(``jsonschema[format-nongpl]``, through jupyter-events and nbformat), and used only by a
schema that asks for the ``iri`` or ``iri-reference`` format, which neither the agent SDK
nor mcp does.

:func:`defer_iri_syntax` puts a stand-in under its name before jsonschema is imported. The
stand-in's ``is_valid_syntax``, what jsonschema takes from it, loads the real module on its
first call and hands over to it; so does reading any other name of it, and from then on the
real module is the one imported under that name. What jsonschema checks, and how, is
unchanged; only when the parsers are built is.
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


def defer_iri_syntax() -> None:
    """Put the stand-in in place, if jsonschema has not loaded the real module yet and would
    use it (it is installed, and the regular-expression ``rfc3987`` is not)."""
    if NAME in sys.modules or "jsonschema" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(NAME)
        if spec is None or importlib.util.find_spec(PREFERRED) is not None:
            return
    except (ImportError, ValueError):  # a broken installation: left to its importers
        return
    stand_in = _StandIn(NAME)
    stand_in.__spec__ = spec  # what find_spec answers while the stand-in is in place
    sys.modules[NAME] = stand_in


class _StandIn(ModuleType):
    """``rfc3987_syntax`` until it is used; see the module's docstring."""

    _lock = threading.Lock()

    def is_valid_syntax(self, term: str, value: str) -> bool:
        return bool(self._real().is_valid_syntax(term, value))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system asks for __path__, __spec__, ...
            raise AttributeError(name)
        return getattr(self._real(), name)

    def _real(self) -> ModuleType:
        with self._lock:
            if sys.modules.get(NAME) is self:
                del sys.modules[NAME]
            return importlib.import_module(NAME)
