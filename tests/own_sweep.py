"""tests/own_app (an app of one's own: `@hydra.main`, a reporter, no trainer) swept in the
test's own process by Hydra's sweep runner, with this sweeper's node: its own task function,
not a copy of it."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.own_app.own_app import main

OWN_APP = Path(__file__).resolve().parent / "own_app" / "own_app.py"
TASK = main.__wrapped__  # the function under @hydra.main


def sweep_own_app(runner, temp_dir: Path, overrides: list[str], keep: Path | None = None) -> None:
    """One sweep of tests/own_app with `overrides`. The runner removes `temp_dir` (the sweep's
    directory) when it ends: `keep` receives a copy of it first."""
    sweep = runner(
        calling_file=str(OWN_APP),
        calling_module=None,
        task_function=TASK,
        config_path=".",
        config_name="config",
        overrides=["hydra/sweeper=hydratrain_optuna", "hydra.job.chdir=false", *overrides],
        temp_dir=str(temp_dir),
    )
    with sweep:
        if keep is not None:
            shutil.copytree(temp_dir, keep)
