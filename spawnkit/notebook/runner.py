"""``spawnkit.notebook.spawn()``: the Python call behind ``%%spawn``.

It resolves what to run (a roster butler, possibly on another runtime, or the
notebook butler), starts the run on the kernel's hub, shows it live (a widget
in Jupyter, text lines in a terminal), and either waits for the result or
returns the background handle. The run is shown once: the value it returns is
not displayed again under the cell (see :mod:`~spawnkit.notebook.display`),
and when the run ends the widget's display is replaced by the same view as
static HTML, which a saved notebook keeps. An interrupt (the stop button)
cancels the run, waits until it is recorded, and raises
:class:`~spawnkit.notebook.failures.RunCancelled`, shown as one line::

    from spawnkit.notebook import spawn
    result = spawn("I weighed 72.4 kg", butler="health", replay="demo.toml")
    handle = spawn("count the words in: a b c", butler="general", background=True)

Configuration mistakes raise :class:`~spawnkit.errors.ConfigError`; the magic
turns them into ``UsageError``.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from ..config.limits import Limits
from ..config.roster import adhoc_butler, load_roster
from ..errors import ConfigError
from ..result import SpawnerResult
from ..run.dispatch import environment_cluster
from ..runtimes import canonical_runtime
from . import conversation
from . import display as shown
from .conversation import NOTEBOOK_BUTLER as NOTEBOOK
from .failures import RunCancelled, remember
from .hub import Hub, RunHandle, Target, default_hub
from .kernel_tools import kernel_tools
from .loop import CANCEL_TIMEOUT_S, Job
from .terminal import TerminalView
from .view import RunView

Render = Literal["auto", "widget", "text", "none"]
T = TypeVar("T")


def in_kernel() -> bool:
    """Whether this is a Jupyter kernel (widgets can be shown) rather than a terminal."""
    if "ipykernel" not in sys.modules:
        return False
    from IPython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


def resolve_target(
    *,
    runtime: str | None,
    butler: str | None,
    roster: str | Path,
    replay: str | Path | None,
    model: str | None,
    kernel_tools_enabled: bool,
    default_runtime: str = "claude-code",
) -> Target:
    if runtime is not None:
        runtime = canonical_runtime(runtime)  # `claude` is `claude-code`, as everywhere
    if butler:
        config = load_roster(roster)[butler]
        if runtime:
            config = config.with_runtime(runtime)
    else:
        config = adhoc_butler(runtime or default_runtime, Path.cwd(), name=NOTEBOOK)
    scenario = Path(replay).expanduser().resolve() if replay else None
    if scenario is not None and not scenario.is_file():
        raise ConfigError(f"replay: no scenario file at {scenario}")
    return Target(config, replay=scenario, model=model, kernel_tools=kernel_tools_enabled)


def on_cluster(target: Target, on: str | None) -> Target:
    """``target`` run on a Dask cluster: ``"dask"`` (the default client, else
    ``$SPAWNKIT_DASK_SCHEDULER``) or a scheduler address; as it is for ``None``.

    ``"dask"`` is resolved now, so a run after the user made a new Client goes to it (the
    hub keeps one service per client), not to the one an earlier run used.
    """
    if on is None:
        return target
    if target.kernel_tools:
        raise ConfigError("the kernel tools read this kernel's variables: not on a cluster")
    if on != "dask":
        return replace(target, on=on)
    found = environment_cluster()
    if isinstance(found, str):
        return replace(target, on=found)
    return replace(target, on="dask", client=found)


def spawn(
    prompt: str,
    *,
    runtime: str | None = None,
    butler: str | None = None,
    roster: str | Path = "roster",
    replay: str | Path | None = None,
    model: str | None = None,
    max_turns: int | None = None,
    context: str | None = None,
    background: bool = False,
    render: Render = "auto",
    namespace: Callable[[], Mapping[str, Any]] | None = None,
    hub: Hub | None = None,
    default_runtime: str = "claude-code",
    limits: Limits | None = None,
    on: str | None = None,
    repo: str | Path | None = None,
    resume: str | None = None,
    continue_last: bool = False,
) -> SpawnerResult | RunHandle:
    """Run ``prompt``; the SpawnerResult, or with ``background`` a RunHandle at once.

    ``namespace`` enables the kernel tools: the agent may read summaries of the
    variables it returns (see :mod:`spawnkit.notebook.kernel_tools`). ``limits`` are laid
    over the butler's ``[butler.limits]`` for this run. ``on`` runs it on a worker of a
    Dask cluster (:func:`on_cluster`), streaming its events here as a local run's.
    ``repo`` has the agent edit a git worktree of that repository (see
    :meth:`Spawner.trigger <spawnkit.run.Spawner.trigger>`); when the run ends the cell shows
    its diff with Apply and Discard (:mod:`spawnkit.notebook.repo_actions`).
    ``continue_last`` goes on with this notebook's last run of the butler, ``resume``
    with the session it names (an id or a unique prefix), on the runtime that ran it
    (see :mod:`~spawnkit.notebook.conversation`); the view shows the earlier turns above.
    """
    if not prompt.strip():
        raise ConfigError("the prompt is empty")
    if max_turns is not None and max_turns < 1:
        raise ConfigError("max_turns must be at least 1")
    hub = hub or default_hub()
    before = None
    if continue_last or resume is not None:
        if continue_last and resume is not None:
            raise ConfigError("--continue goes on with the last run, --resume with one named")
        if repo is not None:
            raise ConfigError("--repo starts a new run on a fresh worktree; it cannot go on")
        key = resume if resume is not None else conversation.last_run(hub, butler or NOTEBOOK)
        record = conversation.resumable(hub.store, key)
        if butler is None and record.butler != NOTEBOOK:
            butler = record.butler
        if runtime is not None and canonical_runtime(runtime) != record.runtime:
            raise ConfigError(f"session {record.id} ran on {record.runtime}: it goes on there")
        runtime = record.runtime
        if continue_last:  # the same scenario and model as the run it continues
            replay, model = _as_before(hub, record.id, replay, model)
        before = conversation.earlier(hub.store, record)
    target = resolve_target(
        runtime=runtime, butler=butler, roster=roster, replay=replay, model=model,
        kernel_tools_enabled=namespace is not None, default_runtime=default_runtime,
    )  # fmt: skip
    if before is not None and target.butler.name != before.record.butler:
        raise ConfigError(
            f"session {before.record.id} ran on butler {before.record.butler!r}, "
            f"not {target.butler.name!r}"
        )
    target = on_cluster(target, on)
    mode = render if render != "auto" else ("widget" if in_kernel() else "text")
    view = RunView(schedule=hub.schedule) if mode == "widget" else None
    if view is not None and before is not None:
        view.earlier = conversation.earlier_html(before)
    text = TerminalView() if mode == "text" and not background else None
    listeners = [sink for sink in (view, text) if sink is not None]
    extensions = [kernel_tools(namespace)] if namespace is not None else []
    handle = hub.start(
        target, prompt, context=context, max_turns=max_turns,
        listeners=listeners, view=view, extensions=extensions,
        limits=limits.validate() if limits is not None else None,
        # The view's approval card answers [butler.permissions] ask; without one, nobody.
        approver=view.approve if view is not None else None,
        repo=repo,
        resume=before.record.id if before is not None else None,
    )  # fmt: skip
    board = None
    try:
        board = _show(view)
        if background:
            if board is not None and view is not None:
                handle.board = board
                view.on_finish.append(lambda finished: board.update(finished))
                if view.finished:
                    board.update(view)
                shown.mark_shown(handle)
            return handle
        result = wait(handle, text)
    except KeyboardInterrupt as interrupt:  # the stop button before the wait began
        error = RunCancelled(stop(handle))
        remember(error)
        raise error from interrupt
    finally:
        if board is not None and not background:
            board.update(view)
    if view is not None or text is not None:
        shown.mark_shown(result)
    if result.repo is not None and mode != "none":
        show_repo_change(result, widgets=mode == "widget")
    return result


def show_repo_change(result: SpawnerResult, *, widgets: bool) -> None:
    """Under a ``repo=`` run: its diff with Apply and Discard, or in a terminal its stat."""
    from .repo_actions import print_change, show_change

    if widgets:
        show_change(result)
    else:
        print_change(result)


def _as_before(
    hub: Hub, session_id: str, replay: str | Path | None, model: str | None
) -> tuple[str | Path | None, str | None]:
    """The scenario and model of this notebook's run ``session_id``, where not given."""
    for handle in hub.runs:
        if handle.session_id == session_id:
            return replay or handle.target.replay, model or handle.target.model
    return replay, model


def _show(view: RunView | None) -> Any:
    """Display the live view; the display handle lets the end of the run replace it."""
    if view is None:
        return None
    from IPython.display import display

    return display(view, display_id=True)  # type: ignore[no-untyped-call]


def wait_job(job: Job[T]) -> T:
    """Block on a background-loop job; an interrupt cancels it, waits for it, re-raises."""
    try:
        while True:
            try:
                return job.future.result(timeout=0.05)
            except TimeoutError:
                continue
    except KeyboardInterrupt:
        job.cancel(wait=CANCEL_TIMEOUT_S)
        raise


def wait(handle: RunHandle, text: TerminalView | None = None) -> SpawnerResult:
    """Block until the run ends; an interrupt stops the run and raises RunCancelled.

    While the cell blocks here the kernel reads no widget message. The view's Stop button
    therefore interrupts the kernel (``view.foreground``), which lands here. The approval card's
    buttons cannot answer a ``[butler.permissions] ask`` question: it is put in the cell's
    input box instead (``input()``, the kernel's stdin channel), and the card says so.
    """
    view = handle.view if isinstance(handle.view, RunView) else None
    if view is not None:
        view.answer_below()
        view.foreground = True  # its Stop button now interrupts the kernel: this wait
    try:
        while True:
            try:
                return handle.job.future.result(timeout=0.05)
            except TimeoutError:
                if text is not None:
                    text.drain()
                if view is not None:
                    answer_in_cell(view)
    except KeyboardInterrupt as interrupt:
        error = RunCancelled(stop(handle))
        remember(error)
        raise error from interrupt
    finally:
        if view is not None:
            view.foreground = False
        if text is not None:
            text.drain(final=True)


def answer_in_cell(view: RunView) -> None:
    """Put the view's next unanswered question in the cell's input box, and answer it."""
    question = view.unasked_below()
    if question is None:
        return
    from IPython.core.error import StdinNotImplementedError

    call_id, prompt = question
    try:
        reply = input(prompt)
    except (EOFError, StdinNotImplementedError):  # a frontend without input (Voila, nbconvert)
        reply = ""
    view.answer(call_id, reply.strip().lower() in ("y", "yes"))


def stop(handle: RunHandle) -> SpawnerResult:
    """Cancel the run and wait (bounded) until it is recorded; its cancelled result.

    Further interrupts while waiting (a second press of the stop button) do not
    abandon the run half-way: it is cancelled already, only its record is due.
    """
    deadline = time.monotonic() + CANCEL_TIMEOUT_S
    handle.cancel(wait=False)
    while time.monotonic() < deadline:
        try:
            return handle.job.future.result(timeout=0.1)
        except TimeoutError:
            continue
        except concurrent.futures.CancelledError:
            break  # stopped before the run was accepted
        except KeyboardInterrupt:
            continue
    return SpawnerResult(
        success=False, status="cancelled", error="the run was cancelled",
        error_kind="cancelled", session_id=handle.session_id,
        butler=handle.target.butler.name, runtime=handle.target.butler.runtime.type,
    )  # fmt: skip
