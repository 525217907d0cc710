"""Programs the e2e tier starts: the trainer, a sweep, the fake app or any Python command as a
process, with the environment they all need. The one place tests start a program from (the fast
tiers may not: tests/tiers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TRAIN = (PY, "-m", "app.train")
FAKE_APP = ROOT / "tests" / "fake_app" / "fake_train.py"
FAKE = (PY, str(FAKE_APP))  # the ten-line app the sweeper tests drive (writes under FAKE_OUT)
TORCHRUN = (PY, "-m", "torch.distributed.run", "--standalone")


def environment(
    out: Path | None = None, path: Iterable[Path] = (ROOT,), **extra: str
) -> dict[str, str]:
    """This process's environment, with Hydra's one-line errors, unbuffered output, the checkout
    on PYTHONPATH (the fake apps import the sweeper from it), FAKE_OUT when given, and `extra`."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    if out is not None:
        env["FAKE_OUT"] = str(out)
    env.update(extra)
    return env


def run(
    argv: Iterable[object],
    *,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """The command run to its end, its output captured as text. `check`: fail the test with the
    end of its stderr unless it exited 0."""
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=environment() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, failure(proc)
    return proc


def start(
    argv: Iterable[object], *, cwd: Path = ROOT, env: dict[str, str] | None = None, **popen
) -> subprocess.Popen[str]:
    """The command started and left running (a sweep to signal, a worker to kill)."""
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    argv = [str(a) for a in argv]
    return subprocess.Popen(argv, cwd=cwd, env=environment() if env is None else env, **kwargs)


def train(
    *args: str, cwd: Path = ROOT, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m app.train ARGS`, `env` added to the environment."""
    return run([*TRAIN, *args], cwd=cwd, env=environment(**(env or {})), timeout=timeout)


def failure(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}:\n{proc.stderr[-3000:]}"
