"""The README leads: short, every docs page linked from it, and every command in it run here
(the project's own commands composed and checked as a run would be; the two front-door
commands are CI's own: .ci/run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests import procs

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# Commands of other tools the README shows: not this project's to run.
OTHERS = {"optuna-dashboard", "tensorboard", "pip"}


def commands() -> list[list[str]]:
    """Each command of the README's bash blocks, as argv (continuations joined, comments off)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv:
                    out.append(argv)
    return out


def train_args(argv: list[str]) -> list[str] | None:
    """The arguments of a `python -m app.train` (or torchrun -m app.train) command."""
    if "app.train" not in argv:
        return None
    return argv[argv.index("app.train") + 1 :]


def test_the_readme_is_short_and_links_every_docs_page():
    assert len(README.splitlines()) < 300
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([\w\-]+\.md)\)", README))
    assert pages and pages <= linked, pages - linked


def test_every_command_is_one_this_test_runs():
    kinds = set()
    for argv in commands():
        program = Path(argv[0]).name
        if program in OTHERS or argv[:2] == ["bash", "scripts/setup.sh"]:
            continue
        kinds.add(argv[argv.index("-m") + 1] if "-m" in argv else program)
    assert kinds == {"app.train", "app.export", "app.gpu_suite", "app.report", "pytest"}, kinds


@pytest.mark.parametrize(
    "args",
    [a for argv in commands() if (a := train_args(argv)) is not None],
    ids=lambda a: " ".join(a)[:60],
)
def test_each_training_command_composes_and_types(args):
    """What the command asks for exists and is well typed (a sweep: its base config): the
    checks a run makes before it starts, short of the files and the device."""
    from app.cli.preflight import _overrides, split_argv
    from app.config.compose import compose
    from app.config.schema import load_config

    inv = split_argv(args)
    assert inv is not None
    load_config(compose(inv.config_name, _overrides(inv)))


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["app.export", "app.gpu_suite", "app.report"])
def test_the_other_commands_answer(module):
    flag = "--list" if module == "app.gpu_suite" else "--help"
    proc = procs.run([procs.PY, "-m", module, flag])
    assert proc.returncode == 0, proc.stderr[-2000:]
