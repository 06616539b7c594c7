"""Credential isolation: which variables a runtime process may see, and their values.

The child of a run gets only ``PATH``, the core API keys, the butler's declared
required and optional variables, its modules' credential variables, the
adapter's own needs (such as ``HOME``), ``TRACEPARENT`` and spawnkit's identity
variables. Values come from :class:`CredentialStore`: spawnkit's own
``credentials`` table first, the environment second. Anything else the host
process has, the child never sees (see :mod:`spawnkit._process` for how that is
enforced on the real process).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from .errors import MissingEnvError
from .roster import ButlerConfig
from .store import SessionStore

CORE_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
ALWAYS = ("PATH",)


class CredentialStore:
    """Resolves variable values: the store's table first, then ``environ``."""

    def __init__(
        self, store: SessionStore | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.store = store
        self.environ = environ if environ is not None else os.environ

    def resolve(self, name: str) -> str | None:
        if self.store is not None:
            value = self.store.credential_get(name)
            if value is not None:
                return value
        return self.environ.get(name)


def allowed_names(
    butler: ButlerConfig, adapter_passthrough: Iterable[str], withheld: Iterable[str] = ()
) -> list[str]:
    """Names a run may see: declared ones always; core keys unless ``withheld``."""
    skip = set(withheld)
    names = [
        *ALWAYS,
        *(key for key in CORE_KEYS if key not in skip),
        *butler.env.required,
        *butler.env.optional,
        *butler.module_credentials,
        *adapter_passthrough,
    ]
    return list(dict.fromkeys(names))


def check_required(butler: ButlerConfig, credentials: CredentialStore) -> None:
    """Raise MissingEnvError naming every required variable without a value."""
    missing = [name for name in butler.env.required if not credentials.resolve(name)]
    if missing:
        raise MissingEnvError(butler.name, missing)


def isolated_env(
    butler: ButlerConfig,
    credentials: CredentialStore,
    adapter_passthrough: Iterable[str],
    extra: Mapping[str, str] | None = None,
    withheld: Iterable[str] = (),
) -> dict[str, str]:
    """The environment for one run: allowed names with values, plus ``extra``."""
    check_required(butler, credentials)
    env: dict[str, str] = {}
    for name in allowed_names(butler, adapter_passthrough, withheld):
        value = credentials.resolve(name)
        if value is not None:
            env[name] = value
    env.update(extra or {})
    return env
