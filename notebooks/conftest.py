"""The notebook kernels nbval starts keep their temporary files in a folder of this test
process, removed when it ends.

nbval stops a notebook's kernel with SIGKILL (``shutdown_kernel(now=True)``), so a
notebook's ``tempfile.TemporaryDirectory`` (its scratch ``SPAWNKIT_HOME``, the way the
notebooks keep a clean slate) is never deleted by the kernel: every test run left one
folder per notebook in /tmp. Kernels inherit ``TMPDIR`` while their first cell is set up
(when nbval starts them), and the folder goes at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_KERNELS_TMP = tempfile.mkdtemp(prefix="spawnkit-kernels-")
# As /tmp is: a local PostgreSQL a notebook starts runs as another user and keeps its
# folder in here.
Path(_KERNELS_TMP).chmod(0o1777)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = _KERNELS_TMP
    try:
        yield
    finally:
        if before is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = before


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_KERNELS_TMP, ignore_errors=True)
