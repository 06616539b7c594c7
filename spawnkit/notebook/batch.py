"""``spawnkit.map``: one butler over a list or a DataFrame of prompts, as a DataFrame.

::

    import spawnkit
    df = spawnkit.map("general", ["count the words in: a b", "count the words in: c"])
    df = spawnkit.map("general", tickets, template="Triage: {title}\\n{body}",
                      max_concurrent=3, max_cost_usd=2.0)
    df = spawnkit.map("general", tasks, runtimes=["claude-code", "codex", "gemini"],
                      repo="~/src/project")       # a worktree per run; its diff a column
    spawnkit.apply_diff(df.loc[3, "diff"], "~/src/project")

The runs happen on the kernel's hub (the same background loop, butler services and store
as ``%%spawn``), through :class:`spawnkit.cluster.batch.Batch`. Progress shows while they run: an
ipywidgets bar in Jupyter, a text line in a terminal. Interrupting (the stop button,
Ctrl-C) cancels the runs in flight, waits until they are recorded, and returns the
partial DataFrame: finished rows intact, the rest ``cancelled`` or ``skipped: stopped``.

A batch in which every run was refused for a reason of configuration (no model key, no
CLI) raises that one error rather than return a frame that reads like a result; when only
some were refused, each such row says why and one warning sums them up.
"""

from __future__ import annotations

import concurrent.futures
import html
import sys
import time
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..cluster.batch import (
    Batch,
    Progress,
    Runner,
    items_for,
    refusal_error,
    refusal_summary,
    to_frame,
)
from ..cluster.worktrees import Worktrees, base_commit
from ..config.roster import ButlerConfig, load_roster
from ..errors import ConfigError
from ..run import Spawner
from ..run.dispatch import Cluster
from ..runtimes import canonical_runtime
from .hub import Hub, Target, default_hub
from .loop import CANCEL_TIMEOUT_S
from .runner import in_kernel

if TYPE_CHECKING:
    import pandas as pd

ProgressMode = Literal["auto", "widget", "text", "none"]
POLL_S = 0.1
# How long an interrupted batch may take to cancel and record its runs in flight.
STOP_WAIT_S = CANCEL_TIMEOUT_S + 10


def map(
    butler: str | ButlerConfig,
    prompts: Any,
    *,
    template: str | None = None,
    prompt_column: str = "prompt",
    runtimes: Sequence[str] | None = None,
    repo: str | Path | None = None,
    cluster: Any = None,
    max_concurrent: int | None = None,
    max_cost_usd: float | None = None,
    roster: str | Path = "roster",
    replay: str | Path | None = None,
    model: str | None = None,
    progress: ProgressMode = "auto",
    hub: Hub | None = None,
) -> pd.DataFrame:
    """Run ``butler`` once per prompt; a DataFrame with one row per prompt (and runtime).

    ``prompts`` is a list of strings, a pandas Series, or a DataFrame with a
    ``prompt_column`` or a ``template`` whose ``{column}`` fields each row fills in. The
    result keeps the input's index and has the columns of :data:`spawnkit.cluster.batch.COLUMNS`
    (with ``runtimes``, one row per prompt and runtime, prompt-major; with ``repo``, a
    ``diff`` column). ``max_concurrent`` (default: the butler's
    ``max_concurrent_sessions``) bounds the runs at once; ``max_cost_usd`` stops
    dispatching once the cost so far reaches it (runs in flight finish; the rest are
    ``skipped: budget``).

    ``cluster`` runs them on a Dask cluster instead of in this process, with the same
    code: a :class:`~spawnkit.run.dispatch.Cluster`, a ``distributed.Client``, a scheduler
    address (``tcp://host:8786``), or ``"dask"`` for the current default client (else
    ``$SPAWNKIT_DASK_SCHEDULER``). ``replay`` then plays on the workers. With ``repo``, the
    worktrees are made here: the workers must see this machine's temporary folder (a
    LocalCluster does).

    Raises the refusal when every run was refused for a reason of configuration (a
    :class:`~spawnkit.errors.MissingApiKeyError`, a
    :class:`~spawnkit.errors.RuntimeNotFoundError`, a ``ConfigError``); warns with a
    summary when some runs were refused.
    """
    config = _butler(butler, roster)
    chosen = [canonical_runtime(r) for r in runtimes] if runtimes else [config.runtime.type]
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"runtimes: each runtime once, not {list(runtimes or [])}")
    keyed, index_name = prompt_list(prompts, template=template, column=prompt_column)
    items = items_for(keyed, chosen)
    scenario = _scenario(replay)
    hub = hub or default_hub()
    targets = {
        runtime: Target(
            config if runtime == config.runtime.type else config.with_runtime(runtime),
            replay=scenario,
            model=model,
        )
        for runtime in chosen
    }
    limit = max_concurrent if max_concurrent is not None else config.runtime.max_concurrent_sessions
    dispatch = _cluster(cluster, scenario)
    worktrees = Worktrees(base_commit(repo)) if repo is not None else None
    try:
        rows = _run(hub, targets, items, limit, max_cost_usd, worktrees, progress, dispatch)
    finally:
        if worktrees is not None:
            worktrees.close()
        if dispatch is not None and dispatch is not cluster:
            dispatch.close()  # made here: closes the Client only if it made that too
    refused = refusal_error(rows)
    if refused is not None:
        raise refused
    summary = refusal_summary(rows)
    if summary is not None:
        warnings.warn(f"spawnkit.map: {summary}", RuntimeWarning, stacklevel=2)
    frame = to_frame(rows, index_name=index_name)
    if len(chosen) > 1:
        frame = frame.set_index("runtime", append=True)
    return frame


def prompt_list(
    prompts: Any, *, template: str | None = None, column: str = "prompt"
) -> tuple[list[tuple[Hashable, str]], Hashable | None]:
    """``(index label, prompt)`` pairs of the input, and the index's name."""
    import pandas as pd

    if isinstance(prompts, str):
        raise ConfigError("prompts: give a list of prompts (a single string is one prompt)")
    if isinstance(prompts, pd.DataFrame):
        if template is not None:
            pairs = [
                (key, _fill(template, row, key))
                for key, row in zip(prompts.index, prompts.to_dict("records"), strict=True)
            ]
        elif column in prompts.columns:
            pairs = list(zip(prompts.index, prompts[column].astype(str), strict=True))
        else:
            raise ConfigError(
                f"prompts: the DataFrame has no {column!r} column; name one with "
                f"prompt_column= or give a template= (columns: {_names(prompts.columns)})"
            )
        name = prompts.index.name
    elif isinstance(prompts, pd.Series):
        pairs = list(zip(prompts.index, prompts.astype(str), strict=True))
        name = prompts.index.name
    elif isinstance(prompts, Iterable):
        values = list(prompts)
        bad = [v for v in values if not isinstance(v, str)]
        if bad:
            raise ConfigError(f"prompts: strings expected, got {type(bad[0]).__name__}")
        if template is not None:
            values = [template.format(prompt=v) for v in values]
        pairs = list(enumerate(values))
        name = None
    else:
        raise ConfigError(f"prompts: a list, Series or DataFrame, not {type(prompts).__name__}")
    if not pairs:
        raise ConfigError("prompts: there are none")
    empty = [key for key, prompt in pairs if not prompt.strip()]
    if empty:
        raise ConfigError(f"prompts: empty prompt at {empty[0]!r}")
    return pairs, name


def _fill(template: str, row: dict[Hashable, Any], key: Hashable) -> str:
    try:
        return template.format(**{str(k): v for k, v in row.items()})
    except KeyError as missing:
        raise ConfigError(
            f"template: no column {missing} (row {key!r} has {_names(row)})"
        ) from None
    except (IndexError, ValueError) as exc:
        raise ConfigError(f"template: {exc} (use {{column}} fields, {{{{ for a brace)") from None


def _names(columns: Iterable[Any]) -> str:
    return ", ".join(str(column) for column in columns)


def _cluster(cluster: Any, scenario: Path | None) -> Cluster | None:
    """``map``'s ``cluster`` argument as a :class:`Cluster` (None: run in this process)."""
    if cluster is None:
        return None
    if isinstance(cluster, Cluster):
        if scenario is not None and cluster.replay is None:
            raise ConfigError("replay: give it to the Cluster (Cluster(..., replay=...))")
        return cluster
    if cluster == "dask":
        return Cluster.from_environment(replay=scenario)
    return Cluster(cluster, replay=scenario)


def _butler(butler: str | ButlerConfig, roster: str | Path) -> ButlerConfig:
    if isinstance(butler, ButlerConfig):
        return butler
    return load_roster(roster)[butler]


def _scenario(replay: str | Path | None) -> Path | None:
    if replay is None:
        return None
    path = Path(replay).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"replay: no scenario file at {path}")
    return path


def _run(
    hub: Hub,
    targets: dict[str, Target],
    items: list[Any],
    max_concurrent: int,
    max_cost_usd: float | None,
    worktrees: Worktrees | None,
    mode: ProgressMode,
    cluster: Cluster | None,
) -> list[Any]:
    latest: list[Progress] = []  # the last snapshot; the batch reports on its loop

    def keep(progress: Progress) -> None:
        latest[:] = [progress]

    bar = _bar(mode, len(items))

    async def host_of(session_id: str) -> str | None:
        import asyncio

        record = await asyncio.to_thread(hub.store.get_session, session_id)
        return record.owner_host if record is not None else None

    async def start() -> Batch:
        runners: dict[str, Runner] = {}
        for runtime, target in targets.items():
            if cluster is None:
                runners[runtime] = await hub.spawner_started(target)
            else:  # the butler's MCP server and the replay model run on the workers
                butler = target.butler
                if target.model:  # the worker's spawner takes the model from the butler
                    butler = replace(butler, runtime=replace(butler.runtime, model=target.model))
                runners[runtime] = Spawner(butler, store=hub.store, cluster=cluster)
        return Batch(
            items, runners, max_concurrent=max_concurrent, max_cost_usd=max_cost_usd,
            on_progress=keep, worktrees=worktrees, host_of=host_of,
        )  # fmt: skip

    batch = hub.loop.submit(start()).future.result(CANCEL_TIMEOUT_S)
    job = hub.loop.submit(batch.run())
    stopping_since: float | None = None
    try:
        while True:
            try:
                rows = job.future.result(timeout=POLL_S)
                break
            except concurrent.futures.TimeoutError:
                if latest:
                    bar.show(latest[-1])
                if stopping_since is not None and time.monotonic() - stopping_since > STOP_WAIT_S:
                    raise RuntimeError(
                        f"spawnkit.map: the runs in flight were not recorded within "
                        f"{STOP_WAIT_S:.0f} s of the stop"
                    ) from None
            except KeyboardInterrupt:
                # Stop: nothing new, cancel what runs, and wait for the partial rows.
                # A second interrupt while they are recorded does not abandon them.
                if stopping_since is None:
                    stopping_since = time.monotonic()
                    hub.loop.call_soon(batch.stop)
    finally:
        if latest:
            bar.show(latest[-1])
        bar.close(latest[-1] if latest else None)
    return rows


class _Bar:
    """No progress display."""

    def show(self, progress: Progress) -> None:
        pass

    def close(self, progress: Progress | None) -> None:
        pass


class _TextBar(_Bar):
    """One line on stderr, rewritten in place (``\\r``) in a terminal."""

    WIDTH = 24

    def __init__(self) -> None:
        self._last = ""

    def show(self, progress: Progress) -> None:
        line = self.render(progress)
        if line != self._last:
            self._last = line
            sys.stderr.write("\r" + line)
            sys.stderr.flush()

    @classmethod
    def render(cls, progress: Progress) -> str:
        ended = progress.done + progress.failed + progress.skipped
        filled = round(cls.WIDTH * ended / progress.total) if progress.total else cls.WIDTH
        return f"[{'#' * filled}{'.' * (cls.WIDTH - filled)}] {progress.line()}"

    def close(self, progress: Progress | None) -> None:
        if self._last:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _WidgetBar(_Bar):
    """An ipywidgets bar and label; replaced by static HTML when the batch ends."""

    def __init__(self, total: int) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        self.bar = widgets.IntProgress(value=0, min=0, max=max(total, 1), description="map")
        self.label = widgets.HTML(value="")
        self.box = widgets.HBox([self.bar, self.label])
        self.handle = display(self.box, display_id=True)  # type: ignore[no-untyped-call]
        self._last: Progress | None = None

    def show(self, progress: Progress) -> None:
        if progress == self._last:
            return
        self._last = progress
        self.bar.value = progress.done + progress.failed + progress.skipped
        self.bar.bar_style = "danger" if progress.failed else ""
        self.label.value = html.escape(progress.line())

    def close(self, progress: Progress | None) -> None:
        from IPython.display import HTML

        if progress is not None and self.handle is not None:
            self.handle.update(HTML(static_html(progress)))  # type: ignore[no-untyped-call]
        self.box.close()


def static_html(progress: Progress) -> str:
    """The finished bar as HTML a saved notebook keeps (widgets need a live kernel)."""
    ended = progress.done + progress.failed + progress.skipped
    share = 100 * ended / progress.total if progress.total else 100
    return (
        '<div class="spawnkit-map"><progress max="100" value="'
        f'{share:.0f}"></progress> {html.escape(progress.line())}</div>'
    )


def _bar(mode: ProgressMode, total: int) -> _Bar:
    if mode == "auto":
        mode = "widget" if in_kernel() else "text"
    if mode == "widget":
        return _WidgetBar(total)
    if mode == "text":
        return _TextBar()
    return _Bar()
