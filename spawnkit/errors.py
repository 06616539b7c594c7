"""spawnkit's exception hierarchy.

Every error spawnkit raises on purpose derives from :class:`SpawnkitError`, so a
caller can catch the family at once and a command line can print one clear line::

    SpawnkitError
    ├── ConfigError                 a roster, scenario or setting is wrong
    │   ├── RosterError             names the file and the key
    │   ├── UnknownRuntimeError     also a ValueError; lists the registered types
    │   └── ScenarioError           a replay scenario file is malformed
    ├── MissingEnvError             a butler's required variable has no value
    ├── MissingApiKeyError          a runtime has no API key and no login; says how to add one
    ├── RuntimeNotFoundError        the agent CLI binary is missing; says how to install it
    ├── InvalidTriggerSource        also a ValueError
    ├── InvalidArgument             a call's argument is out of range; also a ValueError
    ├── InvalidSessionId            also a ValueError; ids become file names
    ├── TriggerRejected             a trigger was refused before it ran
    │   ├── QueueFullError          every slot and queue place is taken
    │   ├── SpawnerClosedError      stop_accepting() was called
    │   └── BudgetRefused           its limits cannot be enforced, or the budget is spent
    ├── RuntimeFailure              the runtime ran and failed (carried in results)
    │   ├── AuthenticationFailure   the model API refused the credentials
    │   ├── RateLimited             the model API is rate limiting
    │   ├── ModelUnavailable        the model API is down, unreachable or failing
    │   ├── RuntimeCrashed          the CLI died or exited without a result
    │   └── ProtocolError           the CLI's output could not be understood
    ├── SandboxUnavailable          runs need bubblewrap and it is missing or cannot work
    ├── HistoryError                unreadable history or pricing table (spawnkit.history)
    ├── SpawnError                  a run failed where the caller asked for an exception
    └── StoreError                  the session store cannot be opened or written
        ├── StoreDamaged            the file's pages are damaged; says how to recover
        ├── StoreUnreachable        a PostgreSQL store refused or cannot be reached
        ├── StoreTooNew             written by a newer spawnkit; names both schema versions
        └── HomeNotWritable         $SPAWNKIT_HOME cannot be created or written

Modules with errors of their own keep them next to their code, in the same tree:
``sources.SourceError`` (a ConfigError: unknown, invalid or duplicate sources),
``sources.GitError``, ``ask.TemplateError`` and ``ask.AskConfigError`` (ConfigErrors),
``ask.AskError`` (the agent failed; carries its stderr), ``contract.ContractError``
(carries the exit code), ``_asgi.ServerStartError`` and
``signals.Stopped`` (a stop signal cancelled a command; carries its exit status);
``notebook.failures.RunFailed`` and ``RunCancelled`` (SpawnErrors a notebook cell raises,
shown as one line).

User mistakes (config, env, missing binaries) are caught before anything is
spawned; failures of a run that was accepted are recorded in its session and
returned in its :class:`~spawnkit.result.SpawnerResult`, not raised.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class SpawnkitError(Exception):
    """Base class of every error spawnkit raises deliberately.

    Picklable whatever a subclass's constructor takes (a trigger refused on a Dask worker
    travels back to the client as the error itself): rebuilt from its args and attributes.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (type(self), self.args, self.__dict__))


def _rebuild_error(
    cls: type[SpawnkitError], args: tuple[Any, ...], state: dict[str, Any]
) -> SpawnkitError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(SpawnkitError):
    """Configuration that cannot be used as written."""


class RosterError(ConfigError):
    """A butler definition is invalid; the message names the file and the key."""

    def __init__(self, path: Path | str, message: str, key: str | None = None) -> None:
        self.path = Path(path)
        self.key = key
        where = f"{self.path}" + (f": [{key}]" if key else "")
        super().__init__(f"{where}: {message}")


class UnknownRuntimeError(ConfigError, ValueError):
    """A runtime type that no adapter is registered for."""

    def __init__(
        self, name: str, available: list[str], aliases: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.available = available
        also = {target: alias for alias, target in (aliases or {}).items()}
        listed = [
            f"{runtime} (or {also[runtime]})" if runtime in also else runtime
            for runtime in sorted(available)
        ]
        super().__init__(f"unknown runtime {name!r}; available runtimes: {', '.join(listed)}")


class ScenarioError(ConfigError):
    """A replay scenario file that cannot be played."""


class MissingEnvError(SpawnkitError):
    """A variable a butler declares as required has no value anywhere."""

    def __init__(self, butler: str, names: list[str]) -> None:
        self.butler = butler
        self.names = names
        super().__init__(
            f"butler {butler!r} requires {', '.join(names)}: set "
            f"{'it' if len(names) == 1 else 'them'} in the environment or with "
            "`spawnkit credentials set NAME`"
        )


class MissingApiKeyError(SpawnkitError):
    """A runtime's CLI would start with no API key and no login: nothing could authenticate it."""

    def __init__(self, runtime: str, names: tuple[str, ...], login_command: str | None) -> None:
        self.runtime = runtime
        self.names = names
        self.login_command = login_command
        first, others = names[0], names[1:]
        alternatives = f" (or {', '.join(others)})" if others else ""
        login = f", or log in with `{login_command}`" if login_command else ""
        super().__init__(
            f"{runtime} has no API key: set {first}{alternatives} in the environment or with "
            f"`spawnkit credentials set {first}`{login}"
        )


class RuntimeNotFoundError(SpawnkitError):
    """The agent CLI a runtime needs is not installed."""

    def __init__(self, runtime: str, binary: str, install_hint: str) -> None:
        self.runtime = runtime
        self.binary = binary
        self.install_hint = install_hint
        super().__init__(
            f"{runtime}: cannot find the {binary!r} CLI; install it with: {install_hint}"
        )


class InvalidTriggerSource(SpawnkitError, ValueError):
    """A trigger source outside tick, external, trigger, route and schedule:<name>."""


class InvalidArgument(SpawnkitError, ValueError):
    """An argument no run can be made of: an empty prompt, ``max_turns`` below 1.

    Also a ``ValueError``, so code written against the plain exception keeps working.
    """


class InvalidSessionId(SpawnkitError, ValueError):
    """A session id that is not a plain name: it would name a path outside spawnkit's home."""


class TriggerRejected(SpawnkitError):
    """A trigger refused before any run started (no session is recorded)."""


class QueueFullError(TriggerRejected):
    """Every concurrent slot and every queue place of a butler is taken."""


class SpawnerClosedError(TriggerRejected):
    """The spawner no longer accepts triggers (``stop_accepting()`` was called)."""


class BudgetRefused(TriggerRejected):
    """A trigger whose limits cannot be enforced, or whose budget is spent, is refused."""


class RuntimeFailure(SpawnkitError):
    """A runtime started and failed; ``kind`` classifies why for the session record.

    Subclasses carry a fixed ``kind`` and a one-line ``remedy`` that is appended to
    the message, so ``SpawnerResult.error`` says both what happened and what to do.
    """

    kind_default = "runtime_error"
    remedy = ""
    # The CLI's exit code, when it exited by itself and said one.
    exit_code: int | None = None

    def __init__(self, message: str, kind: str | None = None, remedy: str | None = None) -> None:
        self.kind = kind or self.kind_default
        self.detail = message
        self.remedy = remedy if remedy is not None else type(self).remedy
        super().__init__(f"{message} ({self.remedy})" if self.remedy else message)


class AuthenticationFailure(RuntimeFailure):
    kind_default = "auth"


class RateLimited(RuntimeFailure):
    kind_default = "rate_limit"
    remedy = "the model API is rate limiting: retry later or lower max_concurrent_sessions"


class ModelUnavailable(RuntimeFailure):
    kind_default = "model_unavailable"
    remedy = "cannot reach the model API: check [butler.runtime] base_url and that the server is up"


class RuntimeCrashed(RuntimeFailure):
    kind_default = "crash"


class ProtocolError(RuntimeFailure):
    kind_default = "protocol"
    remedy = "the CLI's output was not understood: check the CLI version with `spawnkit doctor`"


class SpawnError(SpawnkitError):
    """Raised for a failed run where the caller wants an exception, not a result."""

    # ``result`` is the run's SpawnerResult: not imported here (not even for type checking),
    # as spawnkit.result raises these errors (SpawnerResult.apply) and layers draw no loop.
    def __init__(self, result: Any) -> None:
        self.result = result
        super().__init__(result.error or "the run failed")


class SandboxUnavailable(SpawnkitError):
    """The butler's runs must be sandboxed and bubblewrap is missing or cannot work here."""


class StoreError(SpawnkitError):
    """The session store cannot be opened or written."""


class StoreDamaged(StoreError):
    """The store file's pages are damaged; the message names the file and the way out."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"the session store {path} is damaged ({detail}): run `spawnkit store check "
            f"--repair {path}` (it keeps the damaged file as a backup), or move it aside "
            "and spawnkit starts a fresh store"
        )


class StoreUnreachable(StoreError):
    """A PostgreSQL store cannot be reached or refused us (down, wrong URL or password).

    ``location`` is the store's URL without its password: messages never carry it.
    """

    def __init__(self, location: str, detail: str) -> None:
        self.location = location
        self.detail = detail
        super().__init__(f"the session store {location} cannot be reached: {detail}")


class StoreTooNew(StoreError):
    """The store was written by a newer spawnkit than this one: its schema is refused."""

    def __init__(self, location: str, found: int, supported: int) -> None:
        self.location = location
        self.found = found
        self.supported = supported
        super().__init__(
            f"the session store {location} has schema {found}, newer than the schema "
            f"{supported} this spawnkit reads: upgrade spawnkit"
        )


class HistoryError(SpawnkitError):
    """History that cannot be read: an unknown source, a missing folder or store, or an
    unreadable pricing table (:mod:`spawnkit.config.pricing`)."""


class HomeNotWritable(StoreError):
    """``$SPAWNKIT_HOME`` (or the folder it would be created in) cannot be written."""

    def __init__(self, path: Path, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(
            f"spawnkit's home {path} is read-only or cannot be created ({detail}): "
            "set SPAWNKIT_HOME to a writable directory"
        )
