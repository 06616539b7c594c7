"""The end of a ``%%spawn --repo`` run in a notebook: its whole diff, then Apply and Discard.

Under the run view the cell shows the run's diff (:attr:`SpawnerResult.diff
<spawnkit.result.SpawnerResult.diff>`) as HTML, a ``<pre>`` with added lines green and removed
ones red, an output a saved notebook keeps, and under it an ipywidgets ``HBox``: **Apply**
calls :meth:`SpawnerResult.apply <spawnkit.result.SpawnerResult.apply>` and says which files it
changed, or git's refusal (the repository moved on, or the change is already there);
**Discard** drops the change (the worktree is gone already: nothing else is left to undo).
Once applied or discarded, the buttons are replaced by a line saying so (plain HTML, which a
saved notebook keeps); a refused apply leaves Apply enabled, to try again once the conflict
is resolved. The change stays in the session
record either way (``spawnkit apply SESSION_ID`` from a terminal).
"""

from __future__ import annotations

import html
from typing import Any

from ..errors import SpawnkitError
from ..result import SpawnerResult

DIFF_STYLE = (
    "max-height:36em;overflow:auto;margin:.4em 0;padding:.5em .7em;border-radius:4px;"
    "background:var(--jp-layout-color2,#f6f8fa);font-size:12px;line-height:1.35"
)
LINE_STYLES = {
    "+": "color:#1a7f37;background:rgba(46,160,67,.12)",
    "-": "color:#cf222e;background:rgba(248,81,73,.12)",
    "@": "color:#8250df",
    "d": "font-weight:bold",
}


def diff_html(diff: str) -> str:
    """The diff as one ``<pre>``: + lines green, - lines red, hunk heads violet, file heads bold."""
    lines = []
    for line in diff.splitlines():
        kind = line[:1]
        if line.startswith(("+++", "---", "diff --git")):
            kind = "d"
        style = LINE_STYLES.get(kind)
        text = html.escape(line)
        lines.append(f'<span style="{style}">{text}</span>' if style else text)
    return f'<pre class="spawnkit-diff" style="{DIFF_STYLE}">' + "\n".join(lines) + "</pre>"


def summary_html(result: SpawnerResult) -> str:
    """One line over the diff: which repository, how many files, not applied yet."""
    change = result.repo
    assert change is not None
    repo = html.escape(str(change.repo))
    if not change.diff.strip():
        return f"<div>The run changed nothing in <code>{repo}</code>.</div>"
    files = change.files
    return (
        f"<div><b>Changes to <code>{repo}</code></b>: "
        f"{len(files)} file{'s' if len(files) != 1 else ''}, not applied yet "
        f"(<code>spawnkit apply {html.escape(result.session_id or '')}</code> from a terminal)"
        "</div>"
    )


class RepoActions:
    """The Apply and Discard buttons of one run's change, and the line saying what happened."""

    def __init__(self, result: SpawnerResult) -> None:
        import ipywidgets as widgets

        self.result = result
        self.apply_button = widgets.Button(
            description="Apply", button_style="success", icon="check",
            tooltip="put these changes into the repository's working tree",
        )  # fmt: skip
        self.discard_button = widgets.Button(
            description="Discard", icon="times", tooltip="drop these changes"
        )
        self.status = widgets.HTML()
        self.apply_button.on_click(self.apply)
        self.discard_button.on_click(self.discard)
        self.box = widgets.HBox([self.apply_button, self.discard_button, self.status])
        self.display: Any = None  # the display handle of the box, once shown

    def apply(self, _button: Any = None) -> None:
        if self.apply_button.disabled:  # applied or discarded already
            return
        try:
            touched = self.result.apply()
        except SpawnkitError as refused:
            self._say(f"Not applied: {refused}", "#cf222e")
            return
        self._done()
        self._say(f"Applied: {', '.join(touched)}", "#1a7f37")

    def discard(self, _button: Any = None) -> None:
        if self.discard_button.disabled:
            return
        self._done()
        self._say("Discarded: the repository is unchanged.", "#57606a")

    def _done(self) -> None:
        self.apply_button.disabled = self.discard_button.disabled = True

    def _say(self, text: str, colour: str) -> None:
        self.status.value = f'<span style="color:{colour}">{html.escape(text)}</span>'
        if self.apply_button.disabled and self.display is not None:
            # Decided: the buttons give way to the outcome as plain HTML, which a saved
            # notebook shows without the widget's state.
            from IPython.display import HTML

            self.display.update(HTML(f"<div>{self.status.value}</div>"))  # type: ignore[no-untyped-call]


def show_change(result: SpawnerResult) -> RepoActions | None:
    """Display ``result``'s change under its run view: the diff, then the buttons."""
    from IPython.display import HTML, display

    if result.repo is None:
        return None
    display(HTML(summary_html(result)))  # type: ignore[no-untyped-call]
    if not result.repo.diff.strip():
        return None
    display(HTML(diff_html(result.repo.diff)))  # type: ignore[no-untyped-call]
    actions = RepoActions(result)
    actions.display = display(actions.box, display_id=True)  # type: ignore[no-untyped-call]
    return actions


def print_change(result: SpawnerResult) -> None:
    """In a terminal (IPython without widgets): the diff stat and how to apply it."""
    change = result.repo
    if change is None:
        return
    if not change.diff.strip():
        print(f"The run changed nothing in {change.repo}.")
        return
    print(f"Changes to {change.repo} (not applied yet):\n{change.stat().rstrip()}")
    print("Apply them with result.apply(), or: spawnkit apply", result.session_id)
