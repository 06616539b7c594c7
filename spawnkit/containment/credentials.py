"""Credential isolation: which variables a runtime process may see, their values, which are secret.

The child of a run gets only ``PATH``, the core API keys, the butler's declared
required and optional variables, its modules' credential variables, the
adapter's own needs (such as ``HOME``), ``TRACEPARENT`` and spawnkit's identity
variables. Values come from :class:`CredentialStore`: spawnkit's credentials file
(:mod:`spawnkit.config.credential_file`, never the session store) first, the environment
second. Anything else the host process has, the child never sees (see
:mod:`spawnkit._process` for how that is enforced on the real process).

Every value a run gets is a secret to redact (:mod:`spawnkit.redaction`) except
the host plumbing in :data:`PLUMBING` (paths, locale) and spawnkit's own identity
variables.

A model API's credential (:data:`MODEL_CREDENTIALS`) never reaches a run whose model
traffic goes through spawnkit's relay (:mod:`spawnkit.containment.relay`): :class:`KeySwap` gives
the CLI a per-run placeholder in its place, and the relay, in the spawner's process, swaps the
real value back in on the way out. An agent that prints its environment, or sends its key
somewhere, gives away a value that works nowhere but at its own run's relay.
"""

from __future__ import annotations

import os
import secrets
import string
from collections.abc import Callable, Iterable, Mapping

from ..config.credential_file import CredentialFile
from ..config.roster import ButlerConfig
from ..errors import MissingEnvError
from ..store import SessionStore

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


# The variables that hold a model API's credential: an API key, or a login's bearer token.
MODEL_CREDENTIALS = (
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY", "CODEX_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY",
)  # fmt: skip
# Prefixes a placeholder keeps, so it has the shape of the key it stands for (longest first).
KEY_PREFIXES = ("sk-ant-api03-", "sk-ant-oat01-", "sk-ant-", "sk-proj-", "sk-", "AIza")
# A placeholder's random part: as long as the key's, and never shorter than this.
MIN_PLACEHOLDER_RANDOM = 32
_PLACEHOLDER_ALPHABET = string.ascii_letters + string.digits


def placeholder_for(value: str) -> str:
    """A fresh random stand-in for the credential ``value``: its known prefix (``sk-ant-api03-``,
    ``sk-``, ``AIza``...) and as many random letters and digits as the rest (at least 32)."""
    prefix = next((p for p in KEY_PREFIXES if value.startswith(p)), "")
    length = max(len(value) - len(prefix), MIN_PLACEHOLDER_RANDOM)
    return prefix + "".join(secrets.choice(_PLACEHOLDER_ALPHABET) for _ in range(length))


class KeySwap:
    """One run's model credentials: placeholders for its CLI, the real values for its relay.

    :meth:`hide` gives the CLI's environment a placeholder for each model credential; the
    relay calls :meth:`reveal` on each header value and query string it forwards. The real
    values stay in this object, in the spawner's memory; its repr shows none of them.
    """

    def __init__(self) -> None:
        self._real: dict[str, str] = {}  # placeholder -> the value it stands for

    def hide(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with each model credential in it replaced by a placeholder of its own."""
        hidden = dict(env)
        for name in MODEL_CREDENTIALS:
            value = env.get(name)
            if value:
                placeholder = placeholder_for(value)
                self._real[placeholder] = value
                hidden[name] = placeholder
        return hidden

    def reveal(self, text: str, quote: Callable[[str], str] | None = None) -> str:
        """``text`` with every placeholder replaced by its real value (passed through
        ``quote`` first, for a query string)."""
        for placeholder, real in self._real.items():
            if placeholder in text:
                text = text.replace(placeholder, quote(real) if quote else real)
        return text

    @property
    def placeholders(self) -> list[str]:
        return list(self._real)

    def __bool__(self) -> bool:
        return bool(self._real)

    def __repr__(self) -> str:
        return f"KeySwap({len(self._real)} credentials)"


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

    def pinned(self) -> CredentialStore:
        """These credentials as of now, for one step of a run that asks for the same names
        several times (admitting a trigger, building its CLI's environment): the file is
        read once, each name resolved once. A later step pins them again, and sees a
        value changed meanwhile."""
        return _PinnedCredentials(self)


class _PinnedCredentials(CredentialStore):
    """:meth:`CredentialStore.pinned`: each name's value remembered as first resolved."""

    def __init__(self, base: CredentialStore) -> None:
        super().__init__(base.store, base.environ, file=base.file)
        self._base = base
        # A plain store's file, read at the first name asked (None: not yet, or a subclass
        # whose own resolve decides).
        self._file_values: dict[str, str] | None = None
        self._resolved: dict[str, str | None] = {}

    def resolve(self, name: str) -> str | None:
        if name in self._resolved:
            return self._resolved[name]
        if type(self._base) is CredentialStore:
            if self._file_values is None:
                stored = self.file.load() if self.file is not None else {}
                self._file_values = {key: entry.value for key, entry in stored.items()}
            value = self._file_values.get(name)
            if value is None:
                value = self.environ.get(name)
        else:
            value = self._base.resolve(name)
        self._resolved[name] = value
        return value

    def pinned(self) -> CredentialStore:
        return self


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
