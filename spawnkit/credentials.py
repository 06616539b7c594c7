"""Credential isolation: which variables a runtime process may see, their values, which are secret.

The child of a run gets only ``PATH``, the core API keys, the butler's declared
required and optional variables, its modules' credential variables, the
adapter's own needs (such as ``HOME``), ``TRACEPARENT`` and spawnkit's identity
variables. Values come from :class:`CredentialStore`: spawnkit's credentials file
(:mod:`spawnkit.credential_file`, never the session store) first, the environment
second. Anything else the host process has, the child never sees (see
:mod:`spawnkit._process` for how that is enforced on the real process).

Every value a run gets is a secret to redact (:mod:`spawnkit.redaction`) except
the host plumbing in :data:`PLUMBING` (paths, locale) and spawnkit's own identity
variables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from .credential_file import CredentialFile
from .errors import MissingEnvError
from .roster import ButlerConfig
from .store import SessionStore

CORE_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
ALWAYS = ("PATH",)
# Variables a run may get whose values are host plumbing, not secrets: never redacted.
PLUMBING = frozenset(
    {
        "PATH", "HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "GEMINI_CLI_HOME", "TMPDIR",
        "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
        "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
    }
)  # fmt: skip


class CredentialStore:
    """Resolves variable values: the credentials file first, then ``environ``.

    ``store`` names the session store whose credentials file to use (the file beside
    it; see :meth:`CredentialFile.beside`); ``file`` names one directly. With neither,
    values come from ``environ`` alone.
    """

    def __init__(
        self,
        store: SessionStore | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        file: CredentialFile | None = None,
    ) -> None:
        self.store = store
        self.file = file or (
            CredentialFile.beside_dir(store.local_dir) if store is not None else None
        )
        self.environ = environ if environ is not None else os.environ

    def resolve(self, name: str) -> str | None:
        if self.file is not None:
            value = self.file.get(name)
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


def secret_names(
    butler: ButlerConfig, adapter_passthrough: Iterable[str], withheld: Iterable[str] = ()
) -> list[str]:
    """Names a run may see whose values are secrets: all but :data:`PLUMBING`."""
    return [n for n in allowed_names(butler, adapter_passthrough, withheld) if n not in PLUMBING]


def injected_secrets(
    butler: ButlerConfig,
    credentials: CredentialStore,
    adapter_passthrough: Iterable[str],
    withheld: Iterable[str] = (),
) -> dict[str, str]:
    """The secret values a run of ``butler`` gets now, by name (what to redact)."""
    names = secret_names(butler, adapter_passthrough, withheld)
    return {name: value for name in names if (value := credentials.resolve(name))}


def check_required(butler: ButlerConfig, credentials: CredentialStore) -> None:
    """Raise MissingEnvError naming every required variable without a value."""
    missing = [name for name in butler.env.required if not credentials.resolve(name)]
    if missing:
        raise MissingEnvError(butler.name, missing)


def run_values(
    butler: ButlerConfig,
    credentials: CredentialStore,
    adapter_passthrough: Iterable[str],
    withheld: Iterable[str] = (),
) -> Callable[[str], str | None]:
    """What a run of ``butler`` would get for a variable: its value, or None when it has
    none or is not passed to runs (see :meth:`RuntimeAdapter.check_authenticated
    <spawnkit.runtimes.base.RuntimeAdapter.check_authenticated>`)."""
    passed = set(allowed_names(butler, adapter_passthrough, withheld))
    return lambda name: credentials.resolve(name) if name in passed else None


def missing_optional(butler: ButlerConfig, env: Mapping[str, str]) -> list[str]:
    """The optional variables (``[butler.env] optional``, modules' ``credentials``) a run's
    ``env`` lacks a value for."""
    names = dict.fromkeys([*butler.env.optional, *butler.module_credentials])
    return [name for name in names if not env.get(name)]


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
