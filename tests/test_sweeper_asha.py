"""hpo.pruner=asha: rungs on the evaluation schedule, the pause-or-go-on decision, promotion of
paused trials (by workers that share the storage), and how it is all recorded in Optuna.

The unit tests drive the pruner and the promoter as a worker and its jobs do, in process; the
end-to-end ones run the fake trainer (tests/fake_app), whose "checkpoint" is the step it
paused at. The real trainer's exact resume is in test_sweeper_asha_real.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper import _private as private
from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._pruners._asha import PAUSED, AshaPruner, Promoter
from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import ReportAxis, build_pruner
from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import PROMOTED_FROM, UNCOUNTED, root
from hydra_plugins.hydratrain_optuna_sweeper._study._settings import Liveness
from hydra_plugins.hydratrain_optuna_sweeper._study._shared import (
    StudyTrialBudget,
    counted,
    requeue,
)
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m", "hpo=optuna"]
LIVE = Liveness(
    heartbeat_interval=15, stale_after=120, retry_stale=0, wait_for_running=True, poll_interval=1
)
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _asha(every: int = 10, last: int = 120, **args) -> AshaPruner:
    pruner = build_pruner("asha", args, 1, ReportAxis(every=every, last=last))
    assert isinstance(pruner, AshaPruner)
    return pruner


def test_the_rungs_are_successive_halvings_on_the_evaluation_steps():
    pruner = _asha()  # reduction factor 3: the first evaluation at or after 120 / 9, then x3
    assert [s for s in range(0, 121, 10) if pruner.is_rung(s)] == [20, 60]
    assert [s for s in range(0, 901, 25) if _asha(25, 900).is_rung(s)] == [100, 300]
    # min_resource of its own, placed on the schedule; the last step is never a rung
    pruner = _asha(10, 100, reduction_factor=2, min_resource=15)
    assert [s for s in range(0, 101, 10) if pruner.is_rung(s)] == [20, 30, 60]


@pytest.mark.parametrize(
    "args", [{"reduction_factor": 1}, {"min_resource": 0}, {"grace": 3}, {"reduction_factor": 2.5}]
)
def test_bad_asha_arguments_are_one_line(args):
    with pytest.raises(SweepConfigError, match=r"hpo\.pruner_args") as err:
        _asha(**args)
    assert "\n" not in str(err.value)


def _study(tmp_path: Path, pruner: optuna.pruners.BasePruner | None = None) -> optuna.Study:
    storage = journal(str(tmp_path / "s.journal"))
    return optuna.create_study(study_name="s", storage=storage, pruner=pruner or _asha())


def _reach_rung(
    study: optuna.Study, value: float, step: int = 20, trial: optuna.trial.Trial | None = None
) -> tuple[int, bool]:
    """A job reaching the rung: it reports; paused, the worker records it as such."""
    trial = trial or study.ask()
    trial.suggest_float("x", 0, 1)
    for s in range(10, step + 1, 10):
        trial.report(value + (step - s), s)
    pause = trial.should_prune()
    if pause:
        trial.set_user_attr("run_dir", f"/runs/{trial.number}")
        private.set_system_attr(study, trial, PAUSED, step)
        study.tell(trial, state=TrialState.PRUNED)
    return trial.number, pause


def test_the_first_trials_are_paused_not_judged_against_fewer_than_eta(tmp_path):
    """With eta = 3, the best of the first two trials does not go on by default: it waits at
    the rung until 3 trials reached it, and is promoted then."""
    study = _study(tmp_path)
    promoter = Promoter(study, study, eta=3)
    first, paused = _reach_rung(study, 1.0)  # the best of the study
    assert paused and promoter.candidate(study.get_trials()) is None  # 1 at the rung
    _, paused = _reach_rung(study, 2.0)
    assert paused and promoter.candidate(study.get_trials()) is None  # 2: still fewer than 3
    _, paused = _reach_rung(study, 3.0)
    assert paused  # third of 3: not in the top floor(3 / 3) = 1
    chosen = promoter.candidate(study.get_trials())
    assert chosen is not None and chosen.number == first


def test_a_job_in_another_process_pauses_at_a_rung(tmp_path):
    """The reporter a job rebuilds from the storage (another process: a launcher's, a fleet's
    torchrun) places the rungs on the job's own schedule and raises Paused there."""
    from app.core.outcomes import Paused
    from app.hpo import build_reporter

    study = _study(tmp_path)
    trial = study.ask()
    hpo = {
        "study_name": "s",
        "storage": str(tmp_path / "s.journal"),
        "trial_number": trial.number,
        "reporter": "hydra_plugins.hydratrain_optuna_sweeper.reporter.reporter_for_job",
        "pruner": "asha",
    }
    cfg = OmegaConf.create({"hpo": hpo, "training": {"eval_every": 10, "max_steps": 120}})
    reporter = build_reporter(cfg.hpo, cfg)
    assert reporter.report(10, {"val_loss": 3.0}) is False  # not a rung
    with pytest.raises(Paused) as paused:
        reporter.report(20, {"val_loss": 2.0})  # alone at the first rung
    assert paused.value.step == 20


def test_a_trial_in_the_top_third_of_its_rung_goes_on(tmp_path):
    study = _study(tmp_path)
    for value in (2.0, 3.0):
        _reach_rung(study, value)
    assert _reach_rung(study, 1.0)[1] is False  # best of 3: goes on, no pause
    assert _reach_rung(study, 2.5)[1] is True  # 2nd of 4: floor(4 / 3) = 1
    assert _reach_rung(study, 0.5, step=60)[1] is True  # alone at the second rung


def test_a_promotion_is_a_waiting_copy_that_resumes_and_holds_no_slot(tmp_path):
    study = _study(tmp_path)
    numbers = [_reach_rung(study, v)[0] for v in (1.0, 2.0, 3.0)]
    budget = StudyTrialBudget(
        study, 3, str(tmp_path / "lock"), LIVE, promoter=Promoter(study, study, 3)
    )
    (copy,) = budget.next_trials(1)  # the budget is spent, the promotion still runs
    frozen = private.frozen(study, copy)
    paused = study.get_trials()[numbers[0]]
    assert frozen.params == paused.params and not counted(frozen)
    assert frozen.user_attrs["resume_from"] == "/runs/0"
    assert frozen.user_attrs["promoted_from"] == 0 and frozen.system_attrs[PROMOTED_FROM] == 0
    assert frozen.intermediate_values == paused.intermediate_values  # the whole curve, one trial
    assert root(frozen) == 0
    assert budget.next_trials(1) == []  # nothing else qualifies; no new trial beyond n_trials
    # Paused trials that never get promoted stay PRUNED with their last report as value.
    assert [t.state for t in study.get_trials()[1:3]] == [TrialState.PRUNED] * 2
    assert study.get_trials()[1].value == 2.0


def test_the_stock_n_trials_counts_new_trials_only_and_still_promotes(tmp_path):
    """hydra.sweeper.n_trials (RunTrialBudget): N more trials per run; promotions are not trials."""
    from hydra_plugins.hydratrain_optuna_sweeper._study._shared import RunTrialBudget

    study = _study(tmp_path)
    budget = RunTrialBudget(study, 3, None, LIVE, promoter=Promoter(study, study, 3))
    for value in (1.0, 2.0, 3.0):
        (trial,) = budget.next_trials(1)
        _reach_rung(study, value, trial=trial)
        budget.done(trial)
    (copy,) = budget.next_trials(1)
    assert private.frozen(study, copy).system_attrs[PROMOTED_FROM] == 0
    assert budget.started == 3 and budget.next_trials(1) == []


def test_a_preempted_promoted_trial_stays_in_its_line_and_holds_no_slot(tmp_path):
    study = _study(tmp_path)
    for value in (1.0, 2.0, 3.0):
        _reach_rung(study, value)
    budget = StudyTrialBudget(study, 3, None, LIVE, promoter=Promoter(study, study, 3))
    (copy,) = budget.next_trials(1)
    study.tell(copy, state=TrialState.FAIL)  # as if preempted
    requeue(study, private.frozen(study, copy), {"resume_from": "/runs/3"})
    again = study.get_trials()[-1]
    assert root(again) == 0 and again.system_attrs[UNCOUNTED]
    assert sum(counted(t) for t in study.get_trials()) == 3


def test_two_promotions_of_one_paused_trial_run_once(tmp_path):
    """On a database (no lock across machines) two workers may queue the same promotion: the
    later copy is dropped when asked for."""
    study = _study(tmp_path)
    for value in (1.0, 2.0, 3.0):
        _reach_rung(study, value)
    promoter = Promoter(study, study, 3)
    first = promoter.candidate(study.get_trials())
    assert first is not None
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._asha import promotion

    study.add_trial(promotion(first))
    study.add_trial(promotion(first))  # the other worker's, at the same moment
    budget = StudyTrialBudget(study, 3, None, LIVE, promoter=promoter)
    budget.promoter = None  # only the two queued copies: nothing else to promote
    runs = [study.ask(), study.ask()]
    budget.promoter = promoter
    assert [budget._duplicate(t) for t in runs] == [False, True]
    assert study.get_trials()[-1].user_attrs["reason"] == "duplicate"


# -- the fake trainer: whole sweeps --------------------------------------------------------------

# Ranked by lr, best first: the fake loss is |log10(lr / 3e-3)| above the same curve.
LRS = [3e-3, 1e-3, 3e-4, 1e-2, 1e-4, 3e-2]


def _args(tmp_path: Path, n: int, *extra: str) -> list[str]:
    order = ",".join(f"{{training.lr:{lr}}}" for lr in LRS[:n])
    return [
        f"hpo.n_trials={n}",
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        "hpo.pruner=asha",
        f"hpo.enqueue=[{order}]",
        *extra,
    ]


def _run(tmp_path: Path, args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    env = procs.environment(out=tmp_path)
    return procs.run([*FAKE, *args], env=env, timeout=240, check=check)


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="t", storage=journal(str(tmp_path / "study.journal")))
    return study.get_trials()


def _summary(t: optuna.trial.FrozenTrial) -> dict:
    return json.loads(Path(t.user_attrs["run_dir"], "summary.json").read_text())


@pytest.mark.e2e
@pytest.mark.slow
def test_a_study_pauses_promotes_and_resumes_its_trials(tmp_path):
    """Fake schedule: evaluations every 5 steps to 20, rungs at 5 and 15. The enqueued order
    is arranged so that the best trial (lr 3e-3, trial 0) is paused twice before it qualifies."""
    _run(tmp_path, _args(tmp_path, 6))
    trials = _trials(tmp_path)
    assert sum(counted(t) for t in trials) == 6
    first = trials[0]
    assert first.state == TrialState.PRUNED and first.user_attrs["reason"] == "paused"
    assert first.system_attrs[PAUSED] == 5  # alone at the first rung: paused, not judged
    line = [t for t in trials if root(t) == 0]
    done = line[-1]
    assert done.state == TrialState.COMPLETE and done.params == first.params
    assert not counted(done) and done.user_attrs["promoted_from"] == line[-2].number
    summary = _summary(done)
    assert summary["resumed_from"] == line[-2].user_attrs["run_dir"]
    assert summary["resumed_from_step"] == line[-2].system_attrs[PAUSED]  # from its checkpoint
    assert done.value == pytest.approx(2.0 + 3.0 * 2.718281828 ** (-20 / 10), rel=1e-6)
    results = OmegaConf.load(tmp_path / "multirun" / "optimization_results.yaml")
    assert results.best_trial == done.number
    # Trials that were never promoted end PRUNED with the value of their last report.
    for t in trials:
        if t.state == TrialState.PRUNED and t.number not in [x.number for x in line]:
            assert t.value == t.intermediate_values[max(t.intermediate_values)]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_paused_trial_outlives_its_worker_and_another_worker_promotes_it(tmp_path):
    """Worker A pauses trials 0 and 1 at the first rung, then dies inside trial 2 (like kill
    -9). Worker B, on the same storage, fails trial 2 as stale, and promotes trial 0 (the best
    of the rung) from A's checkpoint once three trials reached the rung."""
    liveness = ("hpo.heartbeat_interval=0.2", "hpo.stale_after=1", "hpo.poll_interval=0.2")
    args = _args(tmp_path, 4, *liveness, "fake.step_sleep=0.05")
    died = _run(tmp_path, [*args, "fake.crash_at_trial=2"], check=False)
    assert died.returncode == 9
    trials = _trials(tmp_path)
    assert [t.user_attrs.get("reason") for t in trials[:2]] == ["paused", "paused"]
    assert trials[2].state == TrialState.RUNNING  # the dead worker's
    _run(tmp_path, args)  # worker B
    trials = _trials(tmp_path)
    assert trials[2].state == TrialState.FAIL and trials[2].user_attrs["reason"] == "stale"
    promoted = [t for t in trials if t.system_attrs.get(PROMOTED_FROM) == 0]
    assert len(promoted) == 1  # once, by B
    assert _summary(promoted[0])["resumed_from"] == trials[0].user_attrs["run_dir"]
    assert _summary(promoted[0])["resumed_from_step"] == 5
    line = [t for t in trials if root(t) == 0]
    assert line[-1].state == TrialState.COMPLETE  # (alone at the second rung: promoted last)
    assert all(t.state.is_finished() for t in trials)
    assert sum(counted(t) for t in trials) == 4


def test_asha_refuses_a_job_config_that_cannot_resume_in_one_line():
    from hydra_plugins.hydratrain_optuna_sweeper._study._checks import check_objectives
    from hydra_plugins.hydratrain_optuna_sweeper._study._settings import read_settings
    from hydra_plugins.hydratrain_optuna_sweeper._study._stock import StockOptions

    node = OmegaConf.create({"n_trials": 3, "pruner": "asha"})
    s = read_settings(StockOptions(stock_node=False), node, "/tmp/sweep")
    check_objectives(OmegaConf.create({"training": {"resume": None}}), s)  # resumable: fine
    with pytest.raises(SweepConfigError, match=r"^hpo\.pruner=asha .* no training\.resume") as e:
        check_objectives(OmegaConf.create({"training": {"max_steps": 20}}), s)
    assert "\n" not in str(e.value)


@pytest.mark.e2e
@pytest.mark.slow
def test_two_workers_at_once_promote_each_paused_trial_once(tmp_path):
    # The best first: it is paused at the first rung (fewer than 3 there) and promoted later.
    lrs = [*LRS, 2e-3, 5e-3, 6e-4]
    args = [
        f"hpo.enqueue=[{','.join(f'{{training.lr:{lr}}}' for lr in lrs)}]",
        "hpo.n_trials=9",
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        "hpo.pruner=asha",
        "hpo.poll_interval=0.2",
        "fake.step_sleep=0.05",
    ]
    env = {**os.environ, "FAKE_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [*FAKE, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for w in workers:
        _, err = w.communicate(timeout=240)
        assert w.returncode == 0, err[-3000:]
    trials = _trials(tmp_path)
    assert all(t.state.is_finished() for t in trials) and sum(counted(t) for t in trials) == 9
    sources = [t.system_attrs[PROMOTED_FROM] for t in trials if PROMOTED_FROM in t.system_attrs]
    assert sources and len(sources) == len(set(sources))  # each paused trial promoted once
    for t in trials:
        if PROMOTED_FROM in t.system_attrs:
            paused = trials[t.system_attrs[PROMOTED_FROM]]
            assert _summary(t)["resumed_from"] == paused.user_attrs["run_dir"]
    assert any(t.state == TrialState.COMPLETE for t in trials)


# -- what the sampler sees: one observation per line ---------------------------------------------


class _Recording(optuna.samplers.RandomSampler):
    """A sampler that keeps what it was shown of the study each time it was asked."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.seen: list[list[optuna.trial.FrozenTrial]] = []

    def infer_relative_search_space(self, study, trial):
        self.seen.append(
            study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        )
        return {}


def _paused_then_completed(study: optuna.Study) -> int:
    """Trial 0 paused at 20 (2.5), promoted as a new trial that completes at 120 (0.5)."""
    first, _ = _reach_rung(study, 2.5)
    paused = study.get_trials()[first]
    copy = optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        params=paused.params,
        distributions=paused.distributions,
        value=0.5,
        intermediate_values={**paused.intermediate_values, 60: 1.0, 120: 0.5},
        system_attrs={"hpo:root": first, PROMOTED_FROM: first, UNCOUNTED: True},
    )
    study.add_trial(copy)
    return first


def test_the_sampler_sees_a_paused_and_promoted_configuration_once_with_its_furthest_result(
    tmp_path,
):
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._line_sampler import LineSampler

    inner = _Recording()
    study = optuna.create_study(
        study_name="s",
        storage=journal(str(tmp_path / "s.journal")),
        sampler=LineSampler(inner),
        pruner=_asha(),
    )
    first = _paused_then_completed(study)
    other, _ = _reach_rung(study, 3.0)  # a line of one trial, paused
    study.ask().suggest_float("x", 0, 1)  # the sampler is asked
    seen = inner.seen[-1]
    assert [t.number for t in seen] == [first, other]  # not the promoted copy (trial 1)
    line = seen[0]
    assert line.state == TrialState.COMPLETE and line.value == 0.5
    assert line.intermediate_values[120] == 0.5 and line.params == study.trials[first].params
    assert seen[1].state == TrialState.PRUNED and seen[1].value == 3.0
    # The study itself is untouched: every trial, as recorded.
    assert len(study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))) == 3
    assert study.trials[first].state == TrialState.PRUNED


def test_a_running_promotion_leaves_the_paused_result_as_the_lines_one_observation(tmp_path):
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._lineage import observations

    study = _study(tmp_path)
    for value in (1.0, 2.0, 3.0):
        _reach_rung(study, value)
    budget = StudyTrialBudget(study, 3, None, LIVE, promoter=Promoter(study, study, 3))
    budget.next_trials(1)  # the promotion of trial 0, now running
    seen = observations(study.get_trials(deepcopy=False))
    assert [(t.number, t.state) for t in seen] == [
        (0, TrialState.PRUNED),
        (1, TrialState.PRUNED),
        (2, TrialState.PRUNED),
    ]


@pytest.mark.parametrize("pruner, wrapped", [("asha", True), ("successive_halving", False)])
def test_an_asha_study_hands_its_sampler_one_observation_per_line(pruner, wrapped):
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._line_sampler import (
        LineSampler,
        unwrapped,
    )
    from hydra_plugins.hydratrain_optuna_sweeper._study._settings import read_settings
    from hydra_plugins.hydratrain_optuna_sweeper._study._space import Entry, parse_space
    from hydra_plugins.hydratrain_optuna_sweeper._study._stock import StockOptions
    from hydra_plugins.hydratrain_optuna_sweeper._sweep._plan import _sampler

    node = OmegaConf.create({"n_trials": 3, "pruner": pruner})
    s = read_settings(StockOptions(stock_node=False), node, "/tmp/sweep")
    sampler = _sampler(s, parse_space([Entry("p", "x=interval(0.0, 1.0)")]))
    assert isinstance(sampler, LineSampler) is wrapped
    assert isinstance(unwrapped(sampler), optuna.samplers.TPESampler)  # the user's, inside


# -- the end of a trial budget ---------------------------------------------------------------------


def _finished(study: optuna.Study, curve: dict[int, float], paused_at: int | None = None) -> int:
    """A trial of parameter x that reported `curve`: paused at its last step, or complete."""
    x = optuna.distributions.FloatDistribution(0, 1)
    last = max(curve)
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.PRUNED if paused_at else TrialState.COMPLETE,
            params={"x": len(study.trials) / 100},
            distributions={"x": x},
            value=None if paused_at else curve[last],
            intermediate_values=curve,
            user_attrs={"run_dir": f"/runs/{len(study.trials)}", "reason": "paused"}
            if paused_at
            else {},
            system_attrs={PAUSED: paused_at} if paused_at else {},
        )
    )
    return len(study.trials) - 1


def test_a_paused_trial_that_leads_its_rung_is_promoted_to_the_top_before_the_study_ends(
    tmp_path,
):
    """Six lines reached the first rung (20); its top two went on to the second (60). One of
    them completed; the other, better at 60, was paused there: 2 lines at that rung, floor(2 / 3)
    = 0 qualify while trials keep coming. The trial budget is spent: successive halving would
    send the rung's best on, so asha does too, before the study ends."""
    study = _study(tmp_path)
    done = _finished(study, {20: 1.5, 60: 1.0, 120: 0.8})
    best = _finished(study, {20: 1.6, 60: 0.9}, paused_at=60)
    for value in (2.0, 2.1, 2.2, 2.3):
        _finished(study, {20: value}, paused_at=20)
    budget = StudyTrialBudget(study, 6, None, LIVE, promoter=Promoter(study, study, 3))
    assert budget.next_trials(1) == []  # the budget is spent and nothing qualifies yet
    assert budget.promote_at_end()  # nothing runs: the rung's best goes on
    (copy,) = budget.next_trials(1)
    assert private.frozen(study, copy).system_attrs[PROMOTED_FROM] == best
    study.tell(copy, 0.7)  # it completed: the rung's best went on, nothing else qualifies
    assert not budget.promote_at_end() and budget.next_trials(1) == []
    assert study.best_trial.value == 0.7 and study.trials[done].value == 0.8


def test_nothing_is_promoted_at_the_end_while_a_trial_still_runs(tmp_path):
    """A running trial may still reach a rung and change who leads it: the end waits for it."""
    study = _study(tmp_path)
    _finished(study, {20: 1.5, 60: 1.0, 120: 0.8})
    _finished(study, {20: 1.6, 60: 0.9}, paused_at=60)
    for value in (2.0, 2.1, 2.2, 2.3):
        _finished(study, {20: value}, paused_at=20)
    study.ask()  # another worker's trial, running
    budget = StudyTrialBudget(study, 6, None, LIVE, promoter=Promoter(study, study, 3))
    assert not budget.promote_at_end()
