"""Training budgets in data: steps derived from the effective batch, the schedule placed at equal
data, trials judged at equal data, the learning rate scaled with the batch."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import optuna
import pytest

from app.config import ConfigError
from app.config.budget import DEFAULT_MAX_STEPS, budget_of
from app.config.training import TrainingConfig
from app.core.outcomes import Pruned, TrainingOOM
from app.engine.records.summary import Summary
from app.engine.run import Observers
from app.engine.runner import run_training
from app.engine.saving import checkpoint as ckpt
from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import (
    ReportAxis,
    build_pruner,
    schedule_of,
)
from tests import procs
from tests.conftest import ROOT, compose, config, tiny

pytestmark = pytest.mark.integration

# 96 samples; every count written in steps of batch 8: warm-up over 32 samples, an evaluation
# and a checkpoint every 32, a log point every 16.
BY_DATA = (
    "training.max_steps=null",
    "training.max_samples=96",
    "training.reference_batch=8",
    "training.warmup_steps=4",
    "training.eval_every=4",
    "training.checkpoint_every=4",
    "training.keep_checkpoints=10",
    "training.log_every=2",
    "training.eval_at_start=false",
    "training.schedule=constant",
    "training.micro_batch_size=4",
)


class Recorder:
    """A trial's reporter that keeps what the run reported, and never prunes."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        self.steps.append(step)
        return False

    def set_attrs(self, attrs) -> None:
        pass


def _records(run_dir, key: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if key in r]


@pytest.mark.parametrize(
    ("batch", "steps"),
    [(8, 480), (16, 240), (48, 80), (50, 77), (64, 60), (3840, 1), (7, 549)],
)
def test_steps_come_from_a_sample_budget_for_any_batch(batch, steps):
    b = budget_of(TrainingConfig(effective_batch_size=batch, max_samples=3840), None)
    assert (b.unit, b.total, b.max_steps) == ("samples", 3840, steps)
    assert b.max_steps == math.ceil(3840 / batch)  # at least the budget, by less than a batch
    assert b.samples_seen(b.max_steps) - 3840 < batch


def test_steps_come_from_a_token_budget_for_causal_lm(tmp_path):
    cfg = config(tiny(tmp_path, "training.max_steps=null", "training.max_tokens=10000"))
    b = cfg.budget()  # data.seq_len=32 and batch 8: 256 tokens a step
    assert (b.unit, b.per_step, b.max_steps) == ("tokens", 256, math.ceil(10000 / 256))
    assert b.tokens_seen(b.max_steps) == 40 * 256


def test_classification_takes_a_sample_budget_and_refuses_a_token_one(tmp_path):
    nli = ["gpu=cpu", "experiment=nli_tiny", "training.max_steps=null"]
    assert config([*nli, "training.max_samples=100"]).budget().max_steps == math.ceil(100 / 16)
    with pytest.raises(ConfigError, match=r"training.max_tokens=1000: this task's samples vary"):
        config([*nli, "training.max_tokens=1000"])


def test_without_a_budget_the_run_keeps_max_steps_and_its_step_counts():
    b = budget_of(TrainingConfig(effective_batch_size=64, eval_every=7, warmup_steps=3), None)
    assert (b.unit, b.max_steps, b.eval_every, b.warmup_steps) == ("steps", DEFAULT_MAX_STEPS, 7, 3)
    assert [d for d in range(1, 30) if b.evaluates(d)] == [7, 14, 21, 28]
    assert b.marks(14) == [14] and b.marks(DEFAULT_MAX_STEPS) == [DEFAULT_MAX_STEPS]


def test_two_budgets_together_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as exc:
        config(tiny(tmp_path, "training.max_samples=100"))  # tiny sets max_steps=6
    assert str(exc.value) == (
        "training.max_steps=6 and training.max_samples=100 are two budgets; set one of "
        "training.max_steps, training.max_samples, training.max_tokens (the others null)"
    )


def test_uneven_batches_evaluate_at_the_first_step_past_each_mark():
    b = budget_of(TrainingConfig(effective_batch_size=12, max_samples=96, reference_batch=8,
                                 eval_every=4), None)  # fmt: skip
    assert b.max_steps == 8 and b.eval_every == 32
    evaluated = [d for d in range(1, 9) if b.evaluates(d)]
    assert evaluated == [3, 6, 8]  # 36, 72 and 96 samples seen
    assert [b.marks(d) for d in evaluated] == [[32], [64], [96]]  # what the trial is told
    assert b.evaluations_after(0) == 3 and b.evaluations_after(3) == 2


def test_a_step_that_crosses_several_marks_reports_at_each():
    """Batch 24, evaluations every 16 samples: a pruner's rung at 320 is never skipped."""
    b = budget_of(TrainingConfig(effective_batch_size=24, max_samples=2880, reference_batch=16,
                                 eval_every=1), None)  # fmt: skip
    assert b.marks(13) == [304] and b.marks(14) == [320, 336]  # 312 -> 336 samples
    assert [m for d in range(1, b.max_steps + 1) for m in b.marks(d)] == list(range(16, 2881, 16))
    # every step evaluates: the banner's count is the steps, not the marks
    assert b.evaluations_after(0) == b.max_steps == 120 and b.evaluations_after(100) == 20


@pytest.mark.slow
def test_two_batch_sizes_warm_up_evaluate_report_and_checkpoint_at_equal_data(tmp_path):
    seen = {}
    for batch in (8, 12, 16):
        recorder = Recorder()
        run_dir = tmp_path / f"b{batch}"
        cfg = config(tiny(tmp_path, *BY_DATA, f"training.effective_batch_size={batch}"))
        summary = run_training(cfg, run_dir, Observers(reporter=recorder))
        assert summary.status == "completed" and summary.samples_seen == 96
        evals = [r["data/samples_seen"] for r in _records(run_dir, "val/loss")]
        saved = [
            int(p.stem.split("_")[1]) * batch
            for p in ckpt.list_checkpoints(run_dir / "checkpoints")
        ]
        # The learning rate of the step that ends at s samples is min(1, s / 32) of the peak:
        # a function of the data seen, whatever the batch.
        rates = {
            r["data/samples_seen"] + batch: r["train/learning_rate"]
            for r in _records(run_dir, "train/learning_rate")
        }
        for end, lr in rates.items():
            assert lr == pytest.approx(3e-3 * min(1.0, end / 32)), (batch, end)
        seen[batch] = (round(summary.warmup_steps * batch), recorder.steps, evals, saved)
    # The warm-up covers 32 samples, trials hear the marks 32, 64, 96 whatever their batch.
    assert {s[0] for s in seen.values()} == {32}
    assert {tuple(s[1]) for s in seen.values()} == {(32, 64, 96)}
    assert seen[8][2] == seen[16][2] == [32, 64, 96]
    assert seen[12][2] == [36, 72, 96]  # an uneven batch: the first step past each mark
    assert seen[8][3] == seen[16][3] == [32, 64, 96]


@pytest.mark.slow
def test_tensorboard_charts_the_losses_against_the_samples_seen(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    run_training(config(tiny(tmp_path, *BY_DATA, "training.effective_batch_size=16")), run_dir)
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    by_step = [e.step for e in acc.Scalars("val/loss")]
    by_samples = [e.step for e in acc.Scalars("by_samples/val/loss")]
    assert by_step == [2, 4, 6] and by_samples == [32, 64, 96]
    assert [e.step for e in acc.Scalars("by_samples/train/loss")] == [16, 32, 48, 64, 80, 96]
    assert [e.value for e in acc.Scalars("data/samples_seen")][-1] == 96


def test_the_pruners_schedule_is_in_samples_under_a_sample_budget(tmp_path):
    steps = schedule_of(compose(tiny(tmp_path)))
    assert steps == ReportAxis(every=3, last=6, unit="steps")
    data = schedule_of(compose(tiny(tmp_path, *BY_DATA)))
    assert data == ReportAxis(every=32, last=96, unit="samples")
    # The same whatever the batch the trial samples: the axis is the data.
    other = schedule_of(compose(tiny(tmp_path, *BY_DATA, "training.effective_batch_size=32")))
    assert other == data


class TrialReporter:
    """Reports to an Optuna trial and asks its pruner, as the sweeper's reporter does."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial

    def report(self, step: int, metrics: dict[str, float]) -> bool:
        self.trial.report(metrics["val_loss"], step)
        return self.trial.should_prune()

    def set_attrs(self, attrs) -> None:
        pass


@pytest.mark.slow
def test_a_pruner_judges_trials_of_two_batch_sizes_at_equal_data(tmp_path):
    base = tiny(tmp_path, *BY_DATA)
    schedule = schedule_of(compose(base))
    pruner = build_pruner("median", {"n_startup_trials": 1}, 1, schedule)
    study = optuna.create_study(pruner=pruner)
    good = study.ask()
    cfg = config([*base, "training.effective_batch_size=16", "training.lr=1e-2"])
    summary = run_training(cfg, tmp_path / "good", Observers(reporter=TrialReporter(good)))
    study.tell(good, summary.final_val["loss"])
    # A hopeless trial at another batch: judged against the first at the same data seen.
    bad = study.ask()
    cfg = config([*base, "training.effective_batch_size=8", "training.lr=1e-6"])
    with pytest.raises(Pruned):
        run_training(cfg, tmp_path / "bad", Observers(reporter=TrialReporter(bad)))
    first, second = study.trials
    assert list(first.intermediate_values) == [32, 64, 96]
    assert list(second.intermediate_values) == [32]  # pruned at its first mark
    summary = Summary.read(tmp_path / "bad")
    assert (summary.status, summary.samples_seen, summary.steps) == ("pruned", 32, 4)


@pytest.mark.slow
def test_lr_scaling_is_applied_to_the_optimizer_and_recorded(tmp_path):
    for scaling, factor in (("none", 1.0), ("sqrt", 2.0), ("linear", 4.0)):
        run_dir = tmp_path / scaling
        cfg = config(
            tiny(
                tmp_path,
                "training.effective_batch_size=32",
                "training.micro_batch_size=16",
                "training.reference_batch=8",
                f"training.lr_scaling={scaling}",
                "training.lr=1e-3",
                "training.warmup_steps=0",
                "training.schedule=constant",
                "training.max_steps=2",
            )
        )
        summary = run_training(cfg, run_dir)
        assert summary.lr == pytest.approx(1e-3 * factor)
        assert summary.lr_scaling == scaling
        logged = [r["train/learning_rate"] for r in _records(run_dir, "train/learning_rate")]
        assert logged == [pytest.approx(1e-3 * factor)] * 2  # what the optimizer stepped with
        assert Summary.read(run_dir).lr == pytest.approx(1e-3 * factor)


@pytest.mark.slow
def test_a_budgeted_run_resumes_to_the_same_result(tmp_path):
    base = tiny(tmp_path, *BY_DATA, "training.effective_batch_size=16", "model.dropout=0.1")
    straight = run_training(config(base), tmp_path / "straight")
    crash = [
        "faults.oom_above_micro_batch=0",
        "faults.oom_from_step=2",
        "training.auto_batch.oom_recovery=false",
    ]
    with pytest.raises(TrainingOOM):
        run_training(config([*base, *crash]), tmp_path / "first")
    resumed = run_training(
        config([*base, f"training.resume={tmp_path / 'first'}"]), tmp_path / "second"
    )
    assert resumed.resumed_from_step == 2 and resumed.steps == straight.steps == 6
    assert resumed.samples_seen == straight.samples_seen == 96
    assert resumed.final_val["loss"] == pytest.approx(straight.final_val["loss"], abs=0)


@pytest.mark.slow
def test_oom_recovery_in_a_budgeted_run_keeps_the_steps_and_the_result(tmp_path):
    base = tiny(
        tmp_path, *BY_DATA, "training.effective_batch_size=16", "training.micro_batch_size=8"
    )
    clean = run_training(config(base), tmp_path / "clean")
    shrunk = run_training(
        config([*base, "faults.oom_above_micro_batch=4", "faults.oom_from_step=2"]),
        tmp_path / "shrunk",
    )
    assert shrunk.oom_count == 1 and shrunk.micro_batch_size <= 4
    assert shrunk.steps == clean.steps == 6 and shrunk.samples_seen == 96
    assert shrunk.final_val["loss"] == pytest.approx(clean.final_val["loss"], rel=1e-4)


SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("name", SWEEPS)
def test_every_shipped_study_that_searches_the_batch_has_a_budget_in_data(name):
    from omegaconf import OmegaConf

    cfg = compose([f"+sweeps={name}"])
    typed = OmegaConf.to_object(cfg)
    budget = budget_of(typed.training, typed.tokens_per_sample())
    searched = OmegaConf.select(cfg, "hydra.sweeper.params", default={}) or {}
    if "training.effective_batch_size" in searched:
        assert budget.unit == "samples", name


def _default_study(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list]:
    """`-m hpo=optuna` as shipped (its space, sampler, pruner, data budget) on the tiny model,
    its first two trials at batch 16 and 64, every trial run to its end."""

    budget_keys = ("training.max_steps", "training.eval_every", "training.warmup_steps")
    fixed = [
        o
        for o in tiny(tmp_path, "training.micro_batch_size=auto")
        if not o.startswith(("training.effective_batch_size", *budget_keys))
    ]
    journal = tmp_path / "study.journal"
    proc = procs.train(
        "-m",
        "hpo=optuna",
        *fixed,
        # 300 steps of 16: a smaller default data budget for the test, the same mechanism
        "training.reference_batch=16",
        "hpo.enqueue=[{training.effective_batch_size:16},{training.effective_batch_size:64}]",
        "hpo.n_trials=2",
        "hpo.pruner=none",
        f"hpo.storage={journal}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    storage = optuna.storages.JournalStorage(backend)
    trials = optuna.load_study(study_name=None, storage=storage).get_trials()
    return proc, sorted(trials, key=lambda t: t.params["training.effective_batch_size"])


@pytest.mark.e2e
def test_the_default_study_trains_batches_16_and_64_on_the_same_data_and_judges_them_there(
    tmp_path,
):
    proc, (small, large) = _default_study(tmp_path)
    assert [t.params["training.effective_batch_size"] for t in (small, large)] == [16, 64]
    # the same samples seen: 300 steps of 16, and 75 of 64
    assert small.user_attrs["samples_seen"] == large.user_attrs["samples_seen"] == 4800
    # judged at the same points of the data (tokens: the tiny corpus packs 32-token blocks)
    assert list(small.intermediate_values) == list(large.intermediate_values)
    assert list(small.intermediate_values)[-1] == 4800 * 32
    out = proc.stdout + proc.stderr
    assert "every batch size is compared at equal data" in out
    assert "compared at equal steps" not in out and "WARNING" not in out


@pytest.mark.e2e
def test_a_step_budget_on_the_study_command_replaces_the_data_budget_and_says_so(tmp_path):
    proc, (small, large) = _default_study(tmp_path, "training.max_steps=20")
    assert (small.user_attrs["samples_seen"], large.user_attrs["samples_seen"]) == (320, 1280)
    assert list(small.intermediate_values)[-1] == list(large.intermediate_values)[-1] == 20
    first = next(line for line in proc.stdout.splitlines() if "] Study " in line)
    assert "trials are compared at equal steps" in first
    assert "a larger training.effective_batch_size has seen more data" in first


def test_every_pruner_places_its_rungs_on_the_data_axis():
    """Trials report every 160 samples up to 3,840: the rungs are marks of data seen."""
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import pruner_defaults
    from tests.test_sweeper import _rung_steps

    axis = ReportAxis(every=160, last=3840, unit="samples")
    # successive halving: the first mark at or past 3840 / 9, then 3 times further
    sh = build_pruner("successive_halving", {}, 1, axis)
    assert _rung_steps(sh, 3840) == [480, 1440]
    asha = build_pruner("asha", {}, 1, axis)
    assert [m for m in range(160, 3841, 160) if asha.is_rung(m)] == [480, 1440]
    assert pruner_defaults("hyperband", axis)["min_resource"] == 160
    assert pruner_defaults("hyperband", axis)["max_resource"] == 3840


def test_a_learning_rate_scaled_past_what_the_optimizer_takes_is_refused(tmp_path):
    scaled = ("training.lr_scaling=linear", "training.reference_batch=2")  # x4 at batch 8
    with pytest.raises(ConfigError) as exc:
        config(tiny(tmp_path, *scaled, "training.lr=0.5", "training.weight_decay=0.5"))
    assert str(exc.value).startswith(
        "training.lr_scaling=linear makes training.lr=0.5 a rate of 2 at batch 8 (reference 2)"
    )
    # lr x weight_decay: 0.3 as written, 1.2 at this batch
    with pytest.raises(ConfigError, match=r"weight_decay=1\.5 with training\.lr=0\.8"):
        config(tiny(tmp_path, *scaled, "training.lr=0.2", "training.weight_decay=1.5"))
    config(tiny(tmp_path, *scaled, "training.lr=0.2", "training.weight_decay=1.0"))  # 0.8: ok


def test_the_profiler_window_is_refused_in_the_steps_it_is_written_in(tmp_path):
    overrides = (*BY_DATA, "training.effective_batch_size=16", "training.profiler.steps=1")
    config(tiny(tmp_path, *overrides, "training.profiler.start_step=10"))  # step 5 of 6
    with pytest.raises(ConfigError) as exc:
        config(tiny(tmp_path, *overrides, "training.profiler.start_step=11"))
    assert str(exc.value) == (
        "training.profiler.start_step=11 is not a step of this run (training.max_samples=96: "
        "6 steps); allowed: 0..10 (steps of training.reference_batch=8)"
    )


@pytest.mark.slow
def test_a_data_budget_resumes_only_at_the_batch_it_was_trained_with(tmp_path):
    base = tiny(tmp_path, *BY_DATA, "training.effective_batch_size=8")
    crash = ["faults.oom_above_micro_batch=0", "faults.oom_from_step=4",
             "training.auto_batch.oom_recovery=false"]  # fmt: skip
    with pytest.raises(TrainingOOM):
        run_training(config([*base, *crash]), tmp_path / "first")
    other = [*base, "training.effective_batch_size=16", f"training.resume={tmp_path / 'first'}"]
    with pytest.raises(ConfigError, match="resumes only at the same batch"):
        run_training(config(other), tmp_path / "second")


def test_the_study_group_budgets_in_data_unless_a_budget_is_set():
    """hpo=optuna: with no budget set, the data 300 steps of the reference batch see (tokens
    for packed text, samples for padded pairs); any budget a file or the command line sets
    replaces it; a single run keeps 300 steps."""

    def budget(*overrides: str):
        typed = config(list(overrides))
        return budget_of(typed.training, typed.tokens_per_sample())

    lm = budget("hpo=optuna")
    assert (lm.unit, lm.total, lm.setting) == (
        "tokens",
        300 * 32 * 128,
        "training.default_budget=data",
    )
    nli = budget("hpo=optuna", "experiment=nli_tiny", "training.max_steps=null")
    assert (nli.unit, nli.total) == ("samples", 300 * 32)
    assert budget("hpo=optuna", "experiment=nli_tiny").unit == "steps"  # the experiment's
    assert budget("hpo=optuna", "+sweeps=tiny_cpu").setting == "training.max_samples"
    assert budget("hpo=optuna", "training.max_steps=40").setting == "training.max_steps"
    single = budget()
    assert (single.unit, single.total) == ("steps", DEFAULT_MAX_STEPS)
