"""Many runs: a butler over many prompts, and runs on a Dask cluster's workers.

The worker's side of a dispatched run and the Dask worker plugin (:mod:`.worker`; the
client's side is :mod:`spawnkit.run.dispatch`); batch runs over many prompts, the engine of
``spawnkit.map`` (:mod:`.batch`); and the throw-away git worktrees a batch run works in
(:mod:`.worktrees`).
"""
