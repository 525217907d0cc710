"""The fleet's plan, its bad settings, its exit status and a trial's one outcome over its
ranks: the parts of `hpo.workers` and `hpo.gpus_per_trial` that need no process."""

from __future__ import annotations

import optuna
import pytest
from omegaconf import OmegaConf

from app.components.hardware.visible import visible_gpus
from app.core.outcomes import Preempted, Pruned, RunOutcome, Status, TrainingOOM
from app.engine.ranks import RankRecord, one_outcome
from hydra_plugins.hydratrain_optuna_sweeper._errors import SweepConfigError
from hydra_plugins.hydratrain_optuna_sweeper._fleet._local import ending
from hydra_plugins.hydratrain_optuna_sweeper._study._fleet_plan import (
    WORKER_ENV,
    FleetAsk,
    plan_fleet,
    seeded_for_worker,
)

pytestmark = pytest.mark.unit

EIGHT = [str(i) for i in range(8)]


def _plan(workers, devices, gpus_per_trial, trials_per_gpu, visible):
    """hpo.workers, devices, gpus_per_trial and trials_per_gpu as written, on `visible`."""
    return plan_fleet(FleetAsk.of(workers, devices, gpus_per_trial, trials_per_gpu), visible)


def test_auto_is_one_worker_per_visible_gpu_and_one_on_a_cpu_machine():
    plan = _plan("auto", None, 1, 1, EIGHT)
    assert plan.workers == 8 and plan.devices == tuple((str(i),) for i in range(8))
    assert plan.env(3) == {WORKER_ENV: "3", "CUDA_VISIBLE_DEVICES": "3"}
    cpu = _plan("auto", None, 1, 1, [])
    assert cpu.workers == 1 and not cpu.is_fleet


def test_gpus_per_trial_groups_the_devices_of_each_worker():
    plan = _plan("auto", None, 2, 1, EIGHT)
    assert plan.workers == 4 and plan.devices[1] == ("2", "3")
    assert plan.env(1)["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_devices_are_pinned_on_a_machine_without_gpus_too():
    plan = _plan(2, [0, 1], 1, 1, [])  # the fake device list of the CPU tests
    assert [plan.env(i)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["0", "1"]
    uuids = _plan(2, ["GPU-a", "GPU-b"], 1, 1, [])
    assert uuids.devices == (("GPU-a",), ("GPU-b",))


def test_workers_without_devices_leave_cuda_visible_devices_alone():
    plan = _plan(3, None, 1, 1, [])
    assert plan.workers == 3 and all(plan.env(i) == {WORKER_ENV: str(i)} for i in range(3))


def test_trials_per_gpu_shares_a_gpu_only_once_every_gpu_has_a_worker():
    plan = _plan("auto", [0, 1], 1, 2, [])
    assert [d[0] for d in plan.devices] == ["0", "1", "0", "1"]


@pytest.mark.parametrize(
    ("workers", "devices", "k", "share", "message"),
    [
        (0, None, 1, 1, "hpo.workers=0 is not allowed; allowed: auto or a positive integer"),
        ("many", None, 1, 1, "hpo.workers='many' is not allowed"),
        (True, None, 1, 1, "hpo.workers=True is not allowed"),
        (1, None, 0, 1, "hpo.gpus_per_trial=0 is not allowed; allowed: a positive integer"),
        (1, None, 1, 0, "hpo.trials_per_gpu=0 is not allowed"),
        (1, [0, 1, 2], 2, 1, "cannot be split into groups of hpo.gpus_per_trial=2"),
        (3, [0, 1], 1, 1, "hpo.workers=3 is more than the devices ['0', '1'] seat"),
        (2, [0, 0], 1, 1, "hpo.devices=[0, 0] is not allowed"),
        (2, [], 1, 1, "hpo.devices=[] is not allowed"),
        (2, "0,1", 1, 1, "hpo.devices='0,1' is not allowed"),
        (2, [-1, 0], 1, 1, "hpo.devices=[-1, 0] is not allowed"),
    ],
)
def test_bad_fleet_settings_are_one_line_naming_the_setting(workers, devices, k, share, message):
    with pytest.raises(SweepConfigError) as err:
        _plan(workers, devices, k, share, EIGHT)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_each_worker_of_a_fleet_samples_with_its_own_seed(monkeypatch):
    node = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": 7})
    assert seeded_for_worker(node).seed == 7  # a lone worker: as configured
    monkeypatch.setenv(WORKER_ENV, "3")
    assert seeded_for_worker(node).seed == 10 and node.seed == 7
    unseeded = OmegaConf.create({"_target_": "optuna.samplers.TPESampler", "seed": None})
    assert seeded_for_worker(unseeded).seed is None


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-x,-1,3")
    assert visible_gpus() == ["2", "GPU-x"]  # CUDA stops at the first invalid entry
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_the_fleet_status_says_whether_every_worker_ended_cleanly(tmp_path, capsys):
    d = str(tmp_path)
    assert ending([("worker 0", 0), ("worker 1", 0)], d, None) == 0
    assert ending([("worker 0", 143), ("worker 1", 143)], d, 15) == 143
    assert ending([("worker 0", 0), ("worker 1", 143)], d, None) == 143  # its own signal
    assert ending([("worker 0", 0), ("worker 1", -9)], d, None) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("error: 1 of 2 workers did not end cleanly (worker 1: killed by")


def _record(rank: int, status: Status, **kw) -> RankRecord:
    return RankRecord(rank=rank, world_size=2, pid=rank, devices=None, status=status.value, **kw)


def test_a_trial_on_two_ranks_gets_one_outcome():
    done = [_record(0, Status.COMPLETED, objective=1.5), _record(1, Status.COMPLETED)]
    assert one_outcome(done) == 1.5  # rank 0's
    with pytest.raises(TrainingOOM, match="rank 1 of 2"):  # the OOM, not its peer's failure
        one_outcome([_record(0, Status.FAILED, error="peer gone"), _record(1, Status.OOM)])
    with pytest.raises(Pruned):
        one_outcome([_record(0, Status.PRUNED, steps=3), _record(1, Status.PRUNED, steps=3)])
    with pytest.raises(Preempted) as stop:
        one_outcome([_record(0, Status.PREEMPTED, steps=4, signum=2), _record(1, Status.FAILED)])
    assert stop.value.signum == 2 and stop.value.step == 4
    with pytest.raises(RunOutcome, match=r"rank\(s\) \[1\] of 2 ended without a record"):
        one_outcome([_record(0, Status.COMPLETED, objective=1.0)])
    with pytest.raises(RunOutcome, match="before any of them recorded"):
        one_outcome([])


def _worker_budget(monkeypatch, storage, worker: int, seed: int, space):
    """Worker `worker` of a fleet on the study in `storage`: hpo=optuna's sampler (hpo.seed
    `seed`) as that worker builds it, and its budget, which draws each new trial's point."""
    from hydra_plugins.hydratrain_optuna_sweeper._study._samplers import build_sampler
    from hydra_plugins.hydratrain_optuna_sweeper._study._settings import read_settings
    from hydra_plugins.hydratrain_optuna_sweeper._study._shared import StudyTrialBudget
    from hydra_plugins.hydratrain_optuna_sweeper._study._stock import StockOptions

    monkeypatch.setenv(WORKER_ENV, str(worker))
    s = read_settings(StockOptions(False), OmegaConf.create({"seed": seed}), "/tmp/sweep")
    sampler = build_sampler(seeded_for_worker(s.sampler), s.sampler_key, dict, 1, oom=True)
    study = optuna.load_study(study_name="s", storage=storage, sampler=sampler)
    return StudyTrialBudget(study, None, None, s.liveness, draw=space.draw)


def test_two_workers_asking_at_once_are_not_handed_the_same_point(monkeypatch):
    """Past the start-up, on a discrete space with one clearly best point, the second worker
    asks while the first one's trial runs: it is handed another point, on every seed tried
    (the sampler alone hands both the best point: its constant liar does not move TPE off a
    point that dominates)."""
    from optuna.trial import TrialState, create_trial

    from hydra_plugins.hydratrain_optuna_sweeper._study._space import Entry, parse_space

    space = parse_space(
        [
            Entry("p", "training.effective_batch_size=choice(16, 32, 64)"),
            Entry("p", "training.warmup_steps=choice(0, 10, 20, 50)"),
        ]
    )
    points = [(b, w) for b in (16, 32, 64) for w in (0, 10, 20, 50)]
    for seed in range(5):
        storage = optuna.storages.InMemoryStorage()
        study = optuna.create_study(storage=storage, study_name="s")
        for b, w in points + points:  # 24 results: past any start-up
            value = 0.1 if (b, w) == (32, 10) else 1.0 + (b + w) / 100
            params = {"training.effective_batch_size": b, "training.warmup_steps": w}
            study.add_trial(
                create_trial(params=params, distributions=space.distributions, value=value)
            )
        (first,) = _worker_budget(monkeypatch, storage, 0, seed, space).next_trials(1)
        (second,) = _worker_budget(monkeypatch, storage, 1, seed, space).next_trials(1)
        space.draw(first), space.draw(second)  # as the workers do: the points drawn above
        assert first.params != second.params, f"seed {seed}: both were handed {first.params}"
        dropped = [t for t in study.get_trials() if t.user_attrs.get("reason") == "duplicate"]
        assert all(t.state == TrialState.FAIL for t in dropped)
