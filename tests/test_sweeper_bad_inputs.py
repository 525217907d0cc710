"""Bad sweep settings with the real entrypoint: one `error:` line, status 2, before the study is
touched. Each case runs `python -m app.train -m hpo=optuna ...` in this process, pointed at an
existing study whose journal must stay byte for byte as it was (no FAIL trial written into it).
"""

from __future__ import annotations

import hashlib
import runpy
import sys
from pathlib import Path

import optuna
import pytest

from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests.conftest import TINY

pytestmark = pytest.mark.integration

# (id, overrides, text the error line must hold)
CASES = [
    (
        "interval-reversed",
        ["hydra.sweeper.params={training.lr:'interval(1e-2,1e-4)'}"],
        "hydra.sweeper.params.training.lr=interval(1e-2,1e-4): `low <= high` must hold",
    ),
    (
        "interval-unclosed",
        ["hydra.sweeper.params={training.lr:'interval('}"],
        "hydra.sweeper.params.training.lr=interval(: cannot parse",
    ),
    (
        "choice-word",
        ["hydra.sweeper.params={training.lr:'choice(0.1, abc)'}"],
        "hydra.sweeper.params.training.lr=choice(0.1, abc): training.lr",
    ),
    (
        "choice-negative-lr",
        ["hydra.sweeper.params={training.lr:'choice(0.1, -0.1)'}"],
        "training.lr=-0.1 must be a finite number in (0, 1]",
    ),
    (
        "interval-negative-lr",
        ["training.lr=interval(-0.1, 0.1)"],
        "training.lr=interval(-0.1, 0.1): training.lr=-0.1 must be",
    ),
    (
        "choice-inf",
        ["training.weight_decay=choice(0.1, inf)"],
        "training.weight_decay=inf must be",
    ),
    (
        "choice-bad-option",
        ["model=choice(tiny_gpt2, gpt5)"],
        "model=choice(tiny_gpt2, gpt5): model=gpt5 is not an option of 'model'",
    ),
    (
        "range-micro-above",
        ["training.micro_batch_size=range(8, 64, 8)"],
        "training.micro_batch_size=64 is larger than training.effective_batch_size",
    ),
    ("metric-unknown", ["hpo.metric=accuracy"], "hpo.metric='accuracy' is not a summary key"),
    ("report-unknown", ["hpo.report_metric=loss"], "hpo.report_metric='loss' is not reported"),
    ("objective-other", ["objective=tokens_per_sec"], "objective=tokens_per_sec but hpo.metric"),
    ("hpo-typo", ["+hpo.n_trail=5"], "hpo.n_trail: no such setting in hpo"),
    ("motpe", ["hydra/sweeper/sampler=motpe"], "The 'motpe' sampler was removed in Optuna 4.0"),
    ("sampler-field", ["hpo.sampler_args={gammma:1}"], "sampler_args.gammma: no such argument"),
    ("grid-continuous", ["hpo.sampler=grid"], "the grid sampler needs discrete values"),
    ("n-jobs", ["hydra.sweeper.n_jobs=0"], "hydra.sweeper.n_jobs=0 must be a positive integer"),
    ("failure-rate", ["hpo.max_failure_rate=2"], "hpo.max_failure_rate=2.0 must be in [0, 1]"),
    ("hook", ["hpo.search_space_fn=no.such.fn"], "hpo.search_space_fn='no.such.fn' cannot be"),
    ("storage-object", ["hydra.sweeper.storage={url:x}"], "hydra.sweeper.storage is a mapping"),
    ("pg-unreachable", ["hpo.storage=postgresql://u:pw@127.0.0.1:9/db"], "cannot be opened"),
]


def _snapshot(*paths: Path) -> dict[str, str]:
    out = {}
    for root in paths:
        for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def study(tmp_path) -> Path:
    """An existing study with one finished trial, in the journal file the sweep would share."""
    path = tmp_path / "study.journal"
    existing = optuna.create_study(study_name="s", storage=journal(str(path)))
    existing.optimize(lambda t: t.suggest_float("training.lr", 1e-4, 1e-2), n_trials=1)
    return path


def invoke(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`python -m app.train ARGV`, in this process: runpy does what `-m` does."""
    monkeypatch.setattr(sys, "argv", ["app.train", *argv])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("app.train", run_name="__main__", alter_sys=True)
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


@pytest.mark.parametrize(("overrides", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_sweep_is_one_line_before_the_study_is_touched(
    overrides, needle, study, tmp_path, monkeypatch, capsys
):
    before = _snapshot(study)
    argv = [
        "-m",
        "hpo=optuna",
        *TINY,
        f"data.cache_dir={tmp_path / 'cache'}",
        "hpo.study_name=s",
        f"hpo.storage={study}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
        *overrides,
    ]
    code, out, err = invoke(argv, monkeypatch, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err + out and "pw@" not in err + out
    assert _snapshot(study) == before
    assert not (tmp_path / "multirun" / "0").exists()  # no trial was started
