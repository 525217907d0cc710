"""`python -m app.bench --hpo-peers`: how soon a study reaches a good configuration, side by
side with what a transformers user would run instead.

One seeded study (app/bench/studies/hpo.py's: the tiny CPU model and search space of
sweeps/tiny_cpu.yaml, 16 trials of 120 steps evaluated every 10), once per sampler: TPE (the
study default, `hpo.sampler=tpe`), whose path depends on what each pruner lets it see, and
random, which draws the same configurations in the same order under every pruner. Run by:

- `none`: this sweeper without a pruner, the reference: its best value is "the best";
- `default`: this sweeper with its default pruner (successive halving);
- `asha`: this sweeper with `hpo.pruner=asha`;
- `trainer` (with the random sampler only, which draws the sweeper's configurations): the
  transformers Trainer's `hyperparameter_search(backend="optuna")` with
  Optuna's SuccessiveHalvingPruner placed as the sweeper's default places it (first rung
  at max_steps / 9, reduction factor 3), on the same data, model, space, seed and steps
  (app/bench/studies/hf_study.py);
- `trainer-optuna-defaults`: the same with `SuccessiveHalvingPruner()` as Optuna defaults it,
  what a Trainer user who does not place the rungs gets.

Per contender: wall time (process start to end), optimizer steps trained, best value, and the
wall time at which the study first completed a trial within 1 % of the reference's best
(seconds since its process started). The goals for asha: within 1 % of the unpruned study's
best, in at most the default pruner's optimizer steps plus 20 %.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from app.bench.studies.hpo import (
    STUDY,
    Goals,
    Params,
    StudyResult,
    TrialRow,
    children_cpu_s,
    fatal_env,
    run_study,
)

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from app.config.schema import TrainConfig

ARMS = {"none": ["hpo.pruner=none"], "default": [], "asha": ["hpo.pruner=asha"]}
PEERS = ("trainer", "trainer-optuna-defaults")
CONTENDERS = (*ARMS, *PEERS)
WITHIN = 0.01  # "within 1 % of the best"
SAMPLERS = ("tpe", "random")
ASHA_STEPS = 1.2  # asha may train at most this many times the default pruner's steps


class SamplerRun(TypedDict):
    """One sampler's studies, and the goals judged from them."""

    reference_best: float  # the unpruned study's
    studies: dict[str, StudyResult]
    same_configurations: dict[str, bool]
    goals: Goals


class PeerSpec(TypedDict, total=False):
    """What the Trainer's study runs (app/bench/studies/hf_study.py reads it): its trials and seed,
    its sampler (random, or tpe) and pruner (successive halving with `pruner_args`, or median), and
    under a data budget the samples each trial trains; `trainer_study` adds the rest."""

    n_trials: int
    seed: int | None
    sampler: str
    pruner: str
    pruner_args: dict[str, object]  # SuccessiveHalvingPruner's
    samples: int
    overrides: list[str]
    tmp: str
    journal: str  # the study's journal file, read back here


class PeersReport(TypedDict):
    samplers: dict[str, SamplerRun]


def run_peers_bench(
    extra: list[str], contenders: list[str], samplers: list[str] | None = None
) -> PeersReport:
    """Per sampler, the contenders' studies and the goals judged from them."""
    if "none" not in contenders:
        raise SystemExit("--hpo-peers: the 'none' contender is the reference; keep it")
    out = {}
    for sampler in samplers or SAMPLERS:
        if sampler not in SAMPLERS:
            raise SystemExit(f"--samplers: {sampler!r} is not one of {', '.join(SAMPLERS)}")
        peers = [c for c in contenders if c in ARMS or sampler == "random"]
        out[sampler] = run_sampler([*extra, f"hpo.sampler={sampler}"], peers)
    return {"samplers": out}


def run_sampler(extra: list[str], contenders: list[str]) -> SamplerRun:
    studies: dict[str, StudyResult] = {}
    for name in contenders:
        if name in ARMS:
            studies[name] = run_study(STUDY + extra + ARMS[name])  # the arm last: it wins
        else:
            studies[name] = run_trainer_study(extra, name)
    best = studies["none"]["best_value"]
    if best is None:
        raise SystemExit("--hpo-peers: the unpruned reference study completed no trial")
    for s in studies.values():
        s["reach_s"] = reach_seconds(s, best)
        s["reach_steps"] = reach_steps(s, best)
    return {
        "reference_best": best,
        "studies": {k: _without_curves(v) for k, v in studies.items()},
        "same_configurations": _same_configurations(studies),
        "goals": goals(studies),
    }


def run_trainer_study(extra: list[str], name: str) -> StudyResult:
    cfg = _config(STUDY + extra)
    hpo, t = cfg.hpo, cfg.training
    micro = t.fixed_micro_batch
    if hpo is None or hpo.n_trials is None or t.max_steps is None or micro is None:
        raise SystemExit(
            "--hpo-peers: the study needs hpo.n_trials, training.max_steps and a fixed "
            "training.micro_batch_size"
        )
    steps = t.max_steps
    pruner_args = _peer_pruner_args(name, t.eval_every, steps)
    spec: PeerSpec = {"n_trials": hpo.n_trials, "seed": hpo.seed, "pruner_args": pruner_args}
    study = trainer_study([*STUDY, *extra], spec, lambda trial: _trainer_row(trial, steps, micro))
    return {**study, "pruner_args": pruner_args}


def trainer_study(
    overrides: list[str], spec: PeerSpec, row: Callable[[FrozenTrial], TrialRow]
) -> StudyResult:
    """The Trainer's study (app/bench/studies/hf_study.py) of `spec` on the config `overrides`
    compose, in a process of its own; its trials as rows (`row`)."""
    import subprocess

    import optuna
    from optuna.storages.journal import JournalFileBackend

    with tempfile.TemporaryDirectory(prefix="bench-hf-study-") as tmp:
        journal = f"{tmp}/study.journal"
        full: PeerSpec = {**spec, "overrides": [*overrides, f"data.cache_dir={tmp}/cache"],
                          "tmp": tmp, "journal": journal}  # fmt: skip
        Path(tmp, "spec.json").write_text(json.dumps(full))
        cmd = [sys.executable, "-m", "app.bench.studies.hf_study", f"{tmp}/spec.json"]
        started, started_at, cpu = time.perf_counter(), time.time(), children_cpu_s()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=fatal_env())
        wall, cpu = time.perf_counter() - started, children_cpu_s() - cpu
        if proc.returncode != 0:
            raise SystemExit(f"Trainer study failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        storage = optuna.storages.JournalStorage(JournalFileBackend(journal))
        trials = optuna.load_study(study_name="peer", storage=storage).get_trials()
    rows = [row(trial) for trial in trials]
    done = [v for r in rows if r["state"] == "COMPLETE" and (v := r["value"]) is not None]
    return {
        "wall_s": wall,
        "started_at": started_at,
        "cpu_s": cpu,
        "states": {s: sum(r["state"] == s for r in rows) for s in {r["state"] for r in rows}},
        "optimizer_steps": sum(r["steps"] for r in rows),
        "best_value": min(done) if done else None,
        "trials": rows,
    }


def _config(overrides: list[str]) -> TrainConfig:
    from app.config.compose import compose
    from app.config.schema import load_config

    return load_config(compose("train", overrides))


def _peer_pruner_args(name: str, eval_every: int, max_steps: int) -> dict[str, object]:
    if name == "trainer-optuna-defaults":
        return {}
    from hydra_plugins.hydratrain_optuna_sweeper.pruning import study_pruner_arguments

    return study_pruner_arguments("successive_halving", {}, eval_every, max_steps)


def _trainer_row(t: FrozenTrial, max_steps: int, micro: int) -> TrialRow:
    """A Trainer trial as the sweeper's rows are (its parameters under the sweeper's names)."""
    pruned_at = max(t.intermediate_values) if t.intermediate_values else 0
    p = t.params
    return {
        "number": t.number,
        "state": t.state.name,
        "value": t.value,
        "params": {
            "training.effective_batch_size": p["gradient_accumulation_steps"] * micro,
            "training.lr": p["learning_rate"],
            "training.weight_decay": p["weight_decay"],
            "training.warmup_steps": p["warmup_steps"],
        },
        "steps": max_steps if t.state.name == "COMPLETE" else pruned_at,
        "end": t.datetime_complete.timestamp() if t.datetime_complete else None,
    }


def reach_seconds(study: StudyResult, best: float) -> float | None:
    """Seconds from the study's start to its first completed trial within 1 % of `best`."""
    ends = [
        end
        for t in study["trials"]
        if (end := t["end"]) is not None
        and t["state"] == "COMPLETE"
        and (value := t["value"]) is not None
        and value <= best * (1 + WITHIN)
    ]
    return min(ends) - study["started_at"] if ends else None


def reach_steps(study: StudyResult, best: float) -> int | None:
    """Optimizer steps the study had trained when it first came within 1 % of `best`: what the
    pruner saved, whatever the load of the machine (the trials that ended by then)."""
    reach = reach_seconds(study, best)
    if reach is None:
        return None
    by = study["started_at"] + reach
    ends = [(t["steps"], t["end"]) for t in study["trials"]]
    return sum(steps for steps, end in ends if end is not None and end <= by)


def _same_configurations(studies: dict[str, StudyResult]) -> dict[str, bool]:
    """Did each contender draw the reference's configurations, in its order?"""
    ref = [t["params"] for t in sorted(studies["none"]["trials"], key=lambda t: t["number"])]
    out = {}
    for name, s in studies.items():
        firsts: dict[str, Params] = {}  # a line's first trial: promoted copies repeat it
        for t in sorted(s["trials"], key=lambda t: t["number"]):
            key = json.dumps(t["params"], sort_keys=True)
            firsts.setdefault(key, t["params"])
        out[name] = _close(list(firsts.values()), ref)
    return out


def _close(a: list[Params], b: list[Params]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        if not all(_same(x[k], y[k]) for k in x):
            return False
    return True


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, (int, float)):
        return abs(x - y) <= 1e-12 * max(1.0, abs(y))
    return x == y


def goals(studies: dict[str, StudyResult]) -> Goals:
    """The issue's goals, each with its figures: met, missed, or not measured."""
    out: Goals = {}
    none, default = studies["none"], studies.get("default")
    trainer = studies.get("trainer")
    if default is not None:
        reach = default["reach_s"]
        out["default_within_third_of_unpruned_wall"] = {
            "reach_s": reach,
            "limit_s": none["wall_s"] / 3,
            "met": reach is not None and reach <= none["wall_s"] / 3,
        }
        if trainer is not None:
            peer = trainer["reach_s"]
            met = reach is not None and (peer is None or reach < peer / 2)
            out["default_under_half_of_trainer"] = {"reach_s": reach, "trainer_s": peer, "met": met}
    if "asha" in studies:
        out.update(_asha_goals(studies["asha"], none, default))
    return out


def _asha_goals(asha: StudyResult, none: StudyResult, default: StudyResult | None) -> Goals:
    best, reference = asha["best_value"], none["best_value"]
    out: Goals = {
        "asha_within_1pct_of_the_best": {
            "best": best,
            "reference": reference,
            "met": best is not None and reference is not None and best <= reference * (1 + WITHIN),
        }
    }
    if default is not None:
        limit = default["optimizer_steps"] * ASHA_STEPS
        out["asha_steps_within_default_plus_20pct"] = {
            "steps": asha["optimizer_steps"],
            "limit": limit,
            "met": asha["optimizer_steps"] <= limit,
        }
    return out


def _without_curves(study: StudyResult) -> StudyResult:
    trials: list[TrialRow] = []
    for t in study["trials"]:
        row = t.copy()
        row.pop("curve", None)
        trials.append(row)
    return {**study, "trials": trials}


def peers_tables(report: PeersReport) -> str:
    return "\n\n".join(
        f"sampler: {name}\n{peers_table(one)}" for name, one in report["samplers"].items()
    )


def peers_table(report: SamplerRun) -> str:
    best = report["reference_best"]
    none = report["studies"]["none"]
    lines = [
        f"reference: the unpruned study's best {best:.4f}; within 1 %: <= {best * 1.01:.4f}",
        "",
        "| contender | trials (state: n) | wall s | CPU s | optimizer steps | best value | "
        "s to within 1 % | / unpruned wall | steps to within 1 % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in report["studies"].items():
        states = ", ".join(f"{k.lower()}: {v}" for k, v in sorted(s["states"].items()))
        reach = s["reach_s"]
        shown = "never" if reach is None else f"{reach:.0f}"
        share = "" if reach is None else f"{reach / none['wall_s']:.2f}"
        value = "n/a" if s["best_value"] is None else f"{s['best_value']:.4f}"
        steps = reach_steps(s, best)
        lines.append(
            f"| {name} | {states} | {s['wall_s']:.0f} | {s.get('cpu_s', 0):.0f} | "
            f"{s['optimizer_steps']:,} | {value} | {shown} | {share} | "
            f"{'' if steps is None else format(steps, ',')} |"
        )
    lines += ["", f"same configurations as the reference: {report['same_configurations']}"]
    for goal, g in report["goals"].items():
        lines.append(f"goal {goal}: {'met' if g['met'] else 'MISSED'} {g}")
    return "\n".join(lines)
