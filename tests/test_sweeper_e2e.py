"""End-to-end sweeps in subprocesses: the fake trainer (tests/fake_app, milliseconds per trial)
for the sweeper's mechanics, the real `python -m app.train` with a tiny CPU model for the rest."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import UNCOUNTED
from hydra_plugins.hydratrain_optuna_sweeper._study._shared import counted
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m"]
REAL = [*procs.TRAIN, "-m"]
# A tiny model, a few seconds per trial on a CPU.
TINY = [
    "gpu=cpu",
    "training.max_steps=6",
    "training.eval_every=2",
    "training.eval_samples=8",
    "training.checkpoint_every=0",
    "training.progress_bar=false",
    "data.builtin_num_docs=200",
    "data.seq_len=64",
    "hydra.sweeper.params={training.effective_batch_size:'choice(8, 16)'}",
]
STUDY = "t"
FIXED_MICRO = "training.micro_batch_size=4"  # skips the auto micro-batch probe
QUIET = ("hpo.tensorboard=false",)  # spares each fake worker the torch import
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _env(tmp_path: Path) -> dict[str, str]:
    return procs.environment(out=tmp_path, HYDRATRAIN_CACHE=str(tmp_path / "cache"))


def _args(tmp_path: Path, n: int, *extra: str) -> list[str]:
    return [
        "hpo=optuna",
        f"hpo.n_trials={n}",
        f"hpo.study_name={STUDY}",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        *extra,
    ]


def _run(cmd: list[str], tmp_path: Path, *args: str, check: bool = True, timeout: int = 240):
    return procs.run([*cmd, *args], env=_env(tmp_path), timeout=timeout, check=check)


def _has_study(tmp_path: Path) -> bool:
    if not (tmp_path / "study.journal").exists():
        return False
    names = optuna.get_all_study_names(storage=journal(str(tmp_path / "study.journal")))
    return STUDY in names


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    storage = journal(str(tmp_path / "study.journal"))
    return optuna.load_study(study_name=STUDY, storage=storage).get_trials()


def _states(trials) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in trials:
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


# -- fake trainer: mechanics -------------------------------------------------------------------


def _oom_constraint(t: optuna.trial.FrozenTrial) -> float:
    """What the sampler reads: Trial.set_constraint (Optuna 5) or constraints_func (4.x)."""
    attrs = t.system_attrs
    return attrs["constraints:oom"] if "constraints:oom" in attrs else attrs["constraints"][0]


def test_outcomes_map_to_states_and_the_sweep_goes_on(tmp_path):
    _run(
        FAKE,
        tmp_path,
        *_args(
            tmp_path,
            10,
            "fake.oom_above_batch=32",
            "fake.diverge_above_lr=0.005",
            "hpo.max_failure_rate=1.0",
        ),
    )
    trials = _trials(tmp_path)
    assert len(trials) == 10
    for t in trials:
        batch, lr = t.params["training.effective_batch_size"], t.params["training.lr"]
        if batch > 32:
            assert t.state == TrialState.PRUNED and t.user_attrs["reason"] == "oom"
            assert _oom_constraint(t) == 1.0  # infeasible: the sampler steers away
        elif lr > 0.005:
            assert t.state == TrialState.FAIL and t.user_attrs["reason"] == "diverged"
        else:
            assert t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            assert _oom_constraint(t) == 0.0  # feasible
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert results.best_params and results.trials.COMPLETE >= 1
    assert list((tmp_path / "multirun" / "tensorboard").glob("trial_*/events.out.tfevents.*"))


def test_other_errors_fail_with_the_message_and_the_rate_limit_stops_the_sweep(tmp_path):
    proc = _run(
        FAKE,
        tmp_path,
        *_args(tmp_path, 10, "fake.error_above_lr=0", *QUIET, "hpo.max_failure_rate=0.5"),
        check=False,
    )
    assert proc.returncode != 0 and "hpo.max_failure_rate=0.5" in proc.stderr
    trials = _trials(tmp_path)
    assert len(trials) == 4  # stopped once the rate was checked (hpo.min_trials_for_failure_rate)
    assert all(t.state == TrialState.FAIL for t in trials)
    assert "RuntimeError: fake error" in trials[0].user_attrs["error"]


@pytest.mark.parametrize(
    ("override", "setting"),
    [
        ("hpo.sampler=annealing", "hpo.sampler"),
        ("hpo.pruner=patient", "hpo.pruner"),
        ("hpo.direction=up", "hpo.direction"),
        ("hydra.sweeper.params={training.lr:'interval(1e-4'}", "hydra.sweeper.params.training.lr"),
        ("hpo.storage=sqlite:////nonexistent/dir/x.db", "hpo.storage"),
        ("hpo.budget_s=-5", "hpo.budget_s=-5"),
    ],
)
def test_bad_inputs_fail_before_any_trial(tmp_path, override, setting):
    proc = _run(FAKE, tmp_path, *_args(tmp_path, 3), override, check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and setting in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "Launching" not in proc.stderr + proc.stdout
    assert not (tmp_path / "multirun" / "0").exists()


def test_stock_sweeper_config_runs_unchanged(tmp_path):
    """tests/fake_app/conf/stock/sphere.yaml is written for hydra-optuna-sweeper (no hpo=...):
    6 trials, a study in memory (storage: null) that leaves no file but the results and the
    report."""
    _run(FAKE, tmp_path, "+stock=sphere", f"hydra.sweep.dir={tmp_path}/multirun")
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert results.study_name == "sphere" and results.storage == "memory"
    assert results.trials.COMPLETE == 6
    assert set(results.best_params) == {
        "training.lr",
        "training.effective_batch_size",
        "training.weight_decay",
        "training.warmup_steps",
    }
    made = {p.name for p in (tmp_path / "multirun").iterdir()}
    report = {"report.html", "optimization_history.png", "param_importances.png"}  # no reports
    assert made == {*map(str, range(6)), "multirun.yaml", "optimization_results.yaml", *report}


def test_conditional_space_hook(tmp_path):
    _run(
        FAKE,
        tmp_path,
        *_args(
            tmp_path,
            8,
            "hpo.search_space_fn=fake_hooks.batch_dependent_warmup",
            *QUIET,
            "hydra.sweeper.params={training.effective_batch_size:'choice(16,32,64)',"
            "training.warmup_steps:0}",
            "hpo.pruner=none",
        ),
    )
    for t in _trials(tmp_path):
        big = t.params["training.effective_batch_size"] >= 64
        assert ("training.warmup_steps" in t.params) == big


def test_several_objectives_give_a_pareto_front(tmp_path):
    _run(
        FAKE,
        tmp_path,
        *_args(
            tmp_path,
            6,
            "hpo.metric=[final_val_loss,tokens_per_sec]",
            "hpo.direction=[minimize,maximize]",
            "hpo.sampler=nsgaii",
            *QUIET,
        ),
    )  # the job returns both, as objective follows hpo.metric
    trials = _trials(tmp_path)
    # The default pruner judges hpo.report_metric (tests/test_sweeper_multiobjective.py): the
    # trials it stops are PRUNED; every other one completes with both values.
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert done and all(len(t.values) == 2 for t in done)
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert 1 <= len(results.solutions) <= len(done) and "params" in results.solutions[0]


def test_killed_sweep_resumes_to_exactly_n_trials(tmp_path):
    args = _args(
        tmp_path,
        4,
        "fake.crash_at_trial=2",
        *QUIET,
        "fake.step_sleep=0.2",
        "hpo.heartbeat_interval=0.5",
        "hpo.stale_after=2",
        "hpo.poll_interval=0.5",
    )
    crashed = _run(FAKE, tmp_path, *args, check=False)
    assert crashed.returncode == 9  # the process died inside trial 2, like kill -9
    assert [t.state for t in _trials(tmp_path)][2] == TrialState.RUNNING
    _run(FAKE, tmp_path, *args)  # the same command again
    trials = _trials(tmp_path)
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert trials[2].state == TrialState.FAIL and trials[2].user_attrs["reason"] == "stale"
    assert all(trials[i].state != TrialState.RUNNING for i in range(4))


def test_stale_trial_is_retried_when_configured(tmp_path):
    args = _args(
        tmp_path,
        4,
        "fake.crash_at_trial=1",
        *QUIET,
        "fake.step_sleep=0.1",
        "hpo.retry_stale=1",
        "hpo.heartbeat_interval=0.3",
        "hpo.stale_after=1",
        "hpo.poll_interval=0.3",
    )
    _run(FAKE, tmp_path, *args, check=False)
    _run(FAKE, tmp_path, *[a for a in args if "crash" not in a])
    trials = _trials(tmp_path)
    counted = [t for t in trials if not t.system_attrs.get(UNCOUNTED)]
    assert len(counted) == 4 and all(t.state.is_finished() for t in trials)
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == 1)
    assert retry.params == trials[1].params and trials[1].user_attrs["reason"] == "stale"


def test_three_workers_share_one_study(tmp_path):
    args = _args(tmp_path, 12, "fake.step_sleep=0.05", "hpo.poll_interval=0.2", *QUIET)
    procs = [
        subprocess.Popen(
            FAKE + args,
            cwd=ROOT,
            env=_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "lock" not in err.lower() or "budget.lock" not in err
    every = _trials(tmp_path)
    # Three terminals with one seed draw the same start-up points: a point drawn while another
    # worker's trial of it runs is dropped (FAIL, duplicate, not counted) and drawn again.
    trials = [t for t in every if counted(t)]
    dropped = [t for t in every if not counted(t)]
    assert len(trials) == len({t.number for t in trials}) == 12  # none lost, no extra
    assert all(t.state == TrialState.FAIL and "run_dir" not in t.user_attrs for t in dropped)
    assert all(t.user_attrs["reason"] == "duplicate" for t in dropped)
    assert all(t.state.is_finished() for t in trials)
    run_dirs = [t.user_attrs["run_dir"] for t in trials if "run_dir" in t.user_attrs]
    assert len(run_dirs) == len(set(run_dirs))
    # No batch barrier: every worker ran trials, one after another as its last one ended.
    per_worker = [
        len(re.findall(r"Trial \d+ (?:COMPLETE|PRUNED|FAIL)", out + err)) for out, err in outputs
    ]
    assert sum(per_worker) == 12 and min(per_worker) >= 1, per_worker


def test_memory_measurement_sees_a_leak(tmp_path):
    """Self-check of the bound used by the memory test: a 20 MB/trial leak must exceed it."""
    _run(FAKE, tmp_path, *_args(tmp_path, 12, "fake.leak_mb=20", *QUIET, "hpo.pruner=none"))
    rss = [t.user_attrs["host_rss_bytes"] for t in _trials(tmp_path)]
    assert rss[-1] - rss[3] > MEMORY_BOUND


# -- the real trainer ---------------------------------------------------------------------------

MEMORY_BOUND = 120 * 2**20  # RSS growth allowed from the 4th to the last in-process trial
ATTRS = (
    "micro_batch_size",
    "grad_accum_steps",
    "effective_batch_size",
    "peak_memory_bytes",
    "tokens_per_sec",
    "run_dir",
)


def test_real_sweep_records_attrs_and_prunes(tmp_path):
    good = "{training.lr:0.01,training.warmup_steps:0}"
    bad = "{training.lr:1e-7,training.warmup_steps:0}"
    _run(
        REAL,
        tmp_path,
        *_args(
            tmp_path,
            8,
            *TINY,
            "training.lr=tag(log, interval(1e-7, 1e-1))",
            "training.warmup_steps=choice(0, 10)",
            f"hpo.enqueue=[{good},{good},{good},{bad}]",
            "hpo.pruner=median",
            "++hpo.pruner_args={n_startup_trials:3,n_warmup_steps:1}",
        ),
    )
    trials = _trials(tmp_path)
    assert len(trials) == 8 and all(t.state.is_finished() for t in trials)
    assert trials[3].state == TrialState.PRUNED and trials[3].user_attrs["reason"] == "pruned"
    for t in trials:
        assert all(k in t.user_attrs for k in ATTRS), t.user_attrs
        assert (Path(t.user_attrs["run_dir"]) / "summary.json").is_file()
        assert t.user_attrs["effective_batch_size"] == t.params["training.effective_batch_size"]
    assert (tmp_path / "multirun" / "optimization_results.yaml").is_file()


def test_real_oom_trials_are_pruned_and_the_sweep_exits_0(tmp_path):
    _run(
        REAL,
        tmp_path,
        *_args(
            tmp_path,
            4,
            *TINY,
            "training.micro_batch_size=choice(2,8)",
            "hpo.enqueue=[{training.micro_batch_size:8},{training.micro_batch_size:2}]",
            "faults.oom_above_micro_batch=4",
            "training.auto_batch.oom_recovery=false",
            "hpo.pruner=none",
        ),
    )
    for t in _trials(tmp_path):
        if t.params["training.micro_batch_size"] == 8:
            assert t.state == TrialState.PRUNED and t.user_attrs["reason"] == "oom"
        else:
            assert t.state == TrialState.COMPLETE


def test_real_kill_9_mid_trial_then_rerun(tmp_path):
    args = _args(
        tmp_path,
        3,
        *TINY,
        FIXED_MICRO,
        # long enough that trial 1 is still training well after its first report (every 2 steps)
        "training.max_steps=200",
        "hpo.heartbeat_interval=0.5",
        "hpo.stale_after=3",
        "hpo.poll_interval=0.5",
        "hpo.pruner=none",
    )
    proc = subprocess.Popen(
        REAL + args,
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline:  # wait until trial 1 has reported (it is mid-training)
        time.sleep(0.2)
        # The journal file exists a moment before the study's first record is in it
        trials = _trials(tmp_path) if _has_study(tmp_path) else []
        if len(trials) >= 2 and trials[1].intermediate_values:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _trials(tmp_path)[1].state == TrialState.RUNNING
    _run(REAL, tmp_path, *args)
    trials = _trials(tmp_path)
    assert len(trials) == 3 and all(t.state.is_finished() for t in trials)
    assert trials[0].state == TrialState.COMPLETE
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs["reason"] == "stale"


def test_real_twenty_in_process_trials_keep_memory_bounded(tmp_path):
    _run(
        REAL,
        tmp_path,
        *_args(
            tmp_path,
            20,
            *TINY,
            "training.max_steps=2",
            FIXED_MICRO,
            "hpo.pruner=none",
            "hpo.tensorboard=false",
        ),
        timeout=400,
    )
    rss = [t.user_attrs["host_rss_bytes"] for t in _trials(tmp_path)]
    assert len(rss) == 20
    assert rss[-1] - rss[3] < MEMORY_BOUND, [r // 2**20 for r in rss]
