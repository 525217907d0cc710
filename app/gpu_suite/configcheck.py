"""The dry run's check of a GPU command: `python -m app.train --cfg job <its overrides>`
composes and validates the settings without running anything (under a second), so a typo in
a setting only the GPU run uses is caught on the CPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

TIMEOUT_S = 60


def trainer_overrides(argv: list[str]) -> list[str] | None:
    """The Hydra overrides of a `python -m app.train` command (also under torchrun), or None
    for any other command."""
    for i in range(1, len(argv)):
        if argv[i] == "app.train" and argv[i - 1] == "-m":
            rest = argv[i + 1 :]
            return None if "--cfg" in rest else [a for a in rest if a not in ("-m", "--multirun")]
    return None


def check(python: str, argv: list[str], cwd: Path, env: dict[str, str]) -> str | None:
    """`ok`, the line the trainer refused the settings with, or None (not a trainer command)."""
    overrides = trainer_overrides(argv)
    if overrides is None:
        return None
    cmd = [python, "-m", "app.train", "--cfg", "job", *overrides]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"--cfg job took over {TIMEOUT_S} s"
    if proc.returncode == 0:
        return "ok"
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [f"exit status {proc.returncode}"])[-1]
