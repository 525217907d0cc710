"""`python -m app.bench --mup-transfer`: does the best learning rate hold across the width under
μP, and does the default study on a narrow proxy tune the wide model?

The tiny GPT-2 (2 layers) at widths 64, 128, 256 and 512 with the heads scaled with the width
(2 to 16: the head width is 32 throughout), every run on the same data (`RUN`: its samples,
sequence length, warm-up and fixed micro-batch), a grid of learning rates a factor 2 apart, two
seeds (training.seed: the initialization and the data order), under the standard
parametrization and under μP (base width 64). Each (width, parametrization, seed) is a grid
study (hpo.sampler=grid, no pruner: every rate runs whole), so every run carries the studies'
own records (value, device-seconds). Then `+sweeps=mup_transfer` on the same data: the default
study (hpo=optuna as shipped: its space, sampler, pruner and budget of 20 trials' worth) with
μP's two multipliers in its space, as the sweep file has them, at width 64 under μP and, in the
same command, its best configuration trained once at width 512; the same command again at seed
1, so that the pick is judged on both seeds.

Goals (the μP issue):
(a) under μP each width's best rate within one grid step (a factor 2) of width 64's, on both
    seeds; under the standard parametrization, how far it moves (measured, whatever it is);
(b) the proxy study's pick at width 512 within 1 % of the best run of width 512's μP grid, on
    each seed;
(c) the proxy study and the target run at most 1/5 of the compute of the default study at width
    512, in device-seconds from the studies' own records. That study is priced, not run: its
    budget is 20 full trials' worth of training (hpo.budget_trials), each worth what a full
    trial at width 512 recorded in the grid (the median; a study of more, shorter trials also
    pays for their start-ups and evaluations, so this is the cheaper side of its cost).

`--cores 0,1`: studies side by side, each pinned to one CPU (run with OMP_NUM_THREADS=1), the
widest first.
"""

from __future__ import annotations

import re
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from app.bench.studies.hpo import (
    Goals,
    StudyResult,
    logged,
    logged_studies,
    run_child,
    run_study,
)
from app.bench.studies.lanes import Task, run_on_cores
from app.engine.records.summary import Summary

WIDTHS = {64: 2, 128: 4, 256: 8, 512: 16}  # model.n_embd: model.n_head
BASE = 64
LRS = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)  # a factor 2 apart
PARAMETRIZATIONS = ("standard", "mup")
SEQ_LEN = 64
SAMPLES = 3200  # 100 steps of the reference batch 32
RUN = [
    "gpu=cpu",
    "training.progress_bar=false",
    f"data.seq_len={SEQ_LEN}",
    "training.max_steps=null",
    f"training.max_samples={SAMPLES}",
    "training.micro_batch_size=16",  # the same split everywhere: no probe, no cache
    f"model.mup.base_width={BASE}",
]
STUDY_BUDGET = 20  # the default study's hpo.budget_trials: full trials' worth of training
WITHIN = 0.01


@dataclass(frozen=True)
class Arm:
    width: int
    parametrization: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.parametrization} width {self.width} seed {self.seed}"

    def overrides(self, lrs: tuple[float, ...]) -> list[str]:
        return [
            "hpo=optuna", "hpo.sampler=grid", "hpo.pruner=none", *RUN,
            f"model.n_embd={self.width}", f"model.n_head={WIDTHS[self.width]}",
            f"model.parametrization={self.parametrization}", f"training.seed={self.seed}",
            f"hydra.sweeper.params={{training.lr:'choice({', '.join(map(str, lrs))})'}}",
        ]  # fmt: skip


class GridRow(TypedDict):
    width: int
    parametrization: str
    seed: int
    losses: dict[str, float | None]  # lr (as text) -> final validation loss (None: diverged)
    device_seconds: list[float]
    cpu_s: float  # the grid study's process, its runs: less swayed by a loaded machine
    best_lr: float | None


class ProxyRun(TypedDict):
    seed: int
    study: StudyResult
    target_value: float | None  # the pick at the target width
    target_device_seconds: float | None
    command: str | None


Done = StudyResult | list[ProxyRun]  # what a lane's task returns: a grid study, the proxy's runs


class TransferReport(TypedDict):
    widths: dict[int, int]
    lrs: list[float]
    samples: int
    seq_len: int
    cores: list[int] | None
    grids: list[GridRow]
    proxy: list[ProxyRun]
    standard_proxy: list[ProxyRun]  # the same, without μP: its pick at 512 as it is
    goals: Goals


# The studies an earlier run printed on stderr (`logged`) that `--reuse` takes instead of
# running them again: the grids and the standard proxy study, those of its lines the log holds
# (a change of μP alone leaves the standard parametrization's as they were; a change of the
# proxy study alone, every grid). The μP proxy study is always run.
REUSABLE = re.compile(r"^((?:standard|mup) width \d+ seed \d+|standard proxy): (\{.*\})$")


def earlier_transfer_studies(log: str) -> dict[str, StudyResult]:
    """The grid studies and the standard proxy study in an earlier run's stderr, by name (the
    standard proxy's pick is trained at the target width again: its runs are not logged)."""
    return logged_studies(log, REUSABLE)


def run_transfer_bench(
    extra: list[str],
    seeds: list[int],
    cores: list[int] | None,
    lrs: tuple[float, ...] = LRS,
    reuse: dict[str, StudyResult] | None = None,
) -> TransferReport:
    reuse = reuse or {}
    arms = [Arm(w, p, s) for w in sorted(WIDTHS, reverse=True) for p in PARAMETRIZATIONS
            for s in seeds]  # fmt: skip
    tasks: dict[str, Task[Done]] = {a.name: _grid_task(a, lrs, extra, reuse) for a in arms[:4]}
    tasks["proxy"] = Task(lambda core: _proxy(extra, seeds, core))
    tasks["standard proxy"] = Task(
        lambda core: _standard_proxy(extra, seeds, core, reuse.get("standard proxy"))
    )
    tasks.update({a.name: _grid_task(a, lrs, extra, reuse) for a in arms[4:]})
    done = run_on_cores(tasks, cores)
    grids = [_grid_row(a, _study(done[a.name]), lrs) for a in arms]
    proxy, standard = done["proxy"], done["standard proxy"]
    if not isinstance(proxy, list) or not isinstance(standard, list):
        raise TypeError("a proxy's task returns its runs")
    return {
        "widths": WIDTHS, "lrs": list(lrs), "samples": SAMPLES, "seq_len": SEQ_LEN,
        "cores": cores, "grids": grids, "proxy": proxy, "standard_proxy": standard,
        "goals": goals(grids, proxy, lrs),
    }  # fmt: skip


def _grid_task(
    arm: Arm, lrs: tuple[float, ...], extra: list[str], reuse: dict[str, StudyResult]
) -> Task[Done]:
    def run(core: int | None) -> Done:
        if arm.name in reuse:
            return reuse[arm.name]
        return logged(arm.name, run_study([*arm.overrides(lrs), *extra], core=core))

    return Task(run)


def _study(result: Done) -> StudyResult:
    if isinstance(result, list):
        raise TypeError("a grid's task returns its study")
    return result


def _grid_row(arm: Arm, study: StudyResult, lrs: tuple[float, ...]) -> GridRow:
    by_lr = {_number(t["params"], "training.lr"): t for t in study["trials"]}
    losses = {str(lr): _value(by_lr.get(lr)) for lr in lrs}
    finished = {lr: v for lr, v in ((float(k), v) for k, v in losses.items()) if v is not None}
    return {
        "width": arm.width,
        "parametrization": arm.parametrization,
        "seed": arm.seed,
        "losses": losses,
        "device_seconds": [t["device_seconds"] or 0.0 for t in study["trials"]],
        "cpu_s": study["cpu_s"],
        "best_lr": min(finished, key=finished.__getitem__) if finished else None,
    }


def _value(trial: object) -> float | None:
    if not isinstance(trial, dict) or trial.get("state") != "COMPLETE":
        return None
    value = trial.get("value")
    return float(value) if isinstance(value, int | float) else None


def _proxy(extra: list[str], seeds: list[int], core: int | None) -> list[ProxyRun]:
    """The default study at width 64 under μP and its pick at 512, in one command; the pick
    again at the other seeds."""
    first = seeds[0]
    study = run_study(
        ["+sweeps=mup_transfer", *RUN, f"training.seed={first}", "hpo.seed=0", *extra],
        core=core,
        transfer=True,
    )
    logged("proxy", study)
    section = study.get("transfer") or {}
    run = section.get("run") if isinstance(section, dict) else None
    command = section.get("command") if isinstance(section, dict) else None
    runs: list[ProxyRun] = [
        {
            "seed": first,
            "study": study,
            "target_value": _number(run, "value"),
            "target_device_seconds": _number(run, "device_seconds"),
            "command": command if isinstance(command, str) else None,
        }
    ]
    for seed in seeds[1:]:
        value, seconds = _retrain(runs[0]["command"], seed, core)
        runs.append({"seed": seed, "study": study, "target_value": value,
                     "target_device_seconds": seconds, "command": runs[0]["command"]})  # fmt: skip
    return runs


STANDARD = [
    "model.parametrization=standard",
    "hpo.transfer.target=[]",
    "hpo.transfer.run=false",
    # μP's multipliers, which the sweep file searches, mean nothing to the standard model
    "hpo.params={model.mup.output_mult:null,model.mup.attn_mult:null}",
]


def _standard_proxy(
    extra: list[str], seeds: list[int], core: int | None, earlier: StudyResult | None = None
) -> list[ProxyRun]:
    """The same default study at width 64 under the standard parametrization (or an earlier
    run's), its pick trained at width 512 as it is: what tuning the narrow model gives the wide
    one without μP."""
    base = ["+sweeps=mup_transfer", *RUN, *STANDARD]
    study = earlier or logged("standard proxy", run_study(
        [*base, f"training.seed={seeds[0]}", "hpo.seed=0", *extra], core=core))  # fmt: skip
    done = [t for t in study["trials"] if t["state"] == "COMPLETE" and t["value"] is not None]
    best = min(done, key=lambda t: t["value"] or 0.0)["params"] if done else None
    if best is None:
        return []
    wide = [f"model.n_embd={max(WIDTHS)}", f"model.n_head={WIDTHS[max(WIDTHS)]}"]
    pick = [*base, *(f"{k}={v}" for k, v in best.items()), *wide, *extra]
    command = " ".join(["python -m app.train", *map(shlex.quote, pick)])
    runs: list[ProxyRun] = []
    for seed in seeds:
        value, seconds = _retrain(command, seed, core)
        runs.append({"seed": seed, "study": study, "target_value": value,
                     "target_device_seconds": seconds, "command": command})  # fmt: skip
    return runs


def _number(mapping: object, key: str) -> float | None:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    return float(value) if isinstance(value, int | float) else None


def _retrain(command: str | None, seed: int, core: int | None) -> tuple[float | None, float | None]:
    """The target command at another training seed: (final validation loss, device-seconds)."""
    if command is None:
        return None, None
    overrides = shlex.split(command)[3:]  # after "python -m app.train"
    with tempfile.TemporaryDirectory(prefix="bench-mup-") as tmp:
        cmd = [sys.executable, "-m", "app.train", *overrides, f"training.seed={seed}",
               f"hydra.run.dir={tmp}/run", f"data.cache_dir={tmp}/cache"]  # fmt: skip
        code, _, stderr = run_child(cmd, Path(tmp, "stderr.log"), core)
        if code != 0:
            raise SystemExit(f"target run failed ({code}): {' '.join(cmd)}\n{stderr[-2000:]}")
        summary = Summary.read(Path(tmp, "run"))
    return summary.final_val.get("loss"), summary.device_seconds


def steps_from(lr: float, reference: float, lrs: tuple[float, ...]) -> int:
    """How many grid steps `lr` lies from `reference` (signed: above is positive)."""
    return lrs.index(lr) - lrs.index(reference)


def goals(grids: list[GridRow], proxy: list[ProxyRun], lrs: tuple[float, ...]) -> Goals:
    out: Goals = {}
    for p in PARAMETRIZATIONS:
        moves = {}
        for seed in sorted({g["seed"] for g in grids}):
            best = {g["width"]: g["best_lr"] for g in grids if g["parametrization"] == p
                    and g["seed"] == seed}  # fmt: skip
            base = best.get(BASE)
            moves[f"seed {seed}"] = {
                w: None if lr is None or base is None else steps_from(lr, base, lrs)
                for w, lr in best.items()
            }
        held = all(m is not None and abs(m) <= 1 for s in moves.values() for m in s.values())
        out[f"a_best_lr_within_one_step_of_width_{BASE}_{p}"] = {"steps": moves, "met": held}
    out["b_the_pick_within_1pct_at_512"] = _goal_b(grids, proxy)
    out["c_at_most_a_fifth_of_the_default_study_at_512"] = _goal_c(grids, proxy)
    return out


def _goal_b(grids: list[GridRow], proxy: list[ProxyRun]) -> dict[str, object]:
    per_seed = {}
    for run in proxy:
        grid = next(g for g in grids if (g["width"], g["parametrization"], g["seed"]) ==
                    (max(WIDTHS), "mup", run["seed"]))  # fmt: skip
        best = min(v for v in grid["losses"].values() if v is not None)
        value = run["target_value"]
        per_seed[f"seed {run['seed']}"] = {
            "pick": value, "grid_best": best,
            "met": value is not None and value <= best * (1 + WITHIN),
        }  # fmt: skip
    return {**per_seed, "met": all(bool(v["met"]) for v in per_seed.values())}


def _goal_c(grids: list[GridRow], proxy: list[ProxyRun]) -> dict[str, object]:
    wide = [s for g in grids if g["width"] == max(WIDTHS) for s in g["device_seconds"]]
    full_trial = statistics.median(wide)
    default_study = STUDY_BUDGET * full_trial
    first = proxy[0]
    study_s = sum(t.get("device_seconds") or 0.0 for t in first["study"]["trials"])
    spent = study_s + (first["target_device_seconds"] or 0.0)
    # The same in CPU-seconds (the proxy study's process runs its target too): a check that
    # does not lean on the machine being as busy during the proxy study as during the grid
    wide_cpu = [g["cpu_s"] / len(g["device_seconds"]) for g in grids if g["width"] == max(WIDTHS)]
    cpu_ratio = first["study"]["cpu_s"] / (STUDY_BUDGET * statistics.median(wide_cpu))
    return {
        "proxy_study_s": study_s,
        "target_run_s": first["target_device_seconds"],
        "full_trial_at_512_s": full_trial,
        "default_study_at_512_s": default_study,
        "ratio": spent / default_study,
        "cpu_ratio": cpu_ratio,
        "met": spent <= default_study / 5,
    }


def mean_curves(report: TransferReport) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """parametrization -> width -> (lr, validation loss averaged over the seeds), where every
    seed finished at that rate."""
    curves: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for p in PARAMETRIZATIONS:
        for width in report["widths"]:
            rows = [g for g in report["grids"] if (g["parametrization"], g["width"]) == (p, width)]
            points = []
            for lr in report["lrs"]:
                values = [g["losses"].get(str(lr)) for g in rows]
                if rows and all(v is not None for v in values):
                    points.append((lr, statistics.fmean(v for v in values if v is not None)))
            curves.setdefault(p, {})[int(width)] = points
    return curves


def transfer_table(report: TransferReport) -> str:
    lrs = report["lrs"]
    lines = [
        f"{report['samples']:,} samples of {report['seq_len']} tokens per run; final validation "
        "loss per learning rate (- : diverged)",
        "",
        "| parametrization | width | seed | "
        + " | ".join(f"{lr:g}" for lr in lrs)
        + " | best lr |",
        "|---|---:|---:|" + "---:|" * len(lrs) + "---:|",
    ]
    for g in report["grids"]:
        cells = [_cell(g["losses"].get(str(lr)), lr == g["best_lr"]) for lr in lrs]
        lines.append(f"| {g['parametrization']} | {g['width']} | {g['seed']} | "
                     + " | ".join(cells) + f" | {g['best_lr']:g} |")  # fmt: skip
    lines.append("")
    for run in report["proxy"]:
        study = run["study"]
        states = ", ".join(f"{k.lower()}: {v}" for k, v in sorted(study["states"].items()))
        target = f"{run['target_value']} ({run['target_device_seconds']} device-s)"
        lines.append(f"proxy study (width {BASE}, μP, seed {run['seed']}): {states}; best "
                     f"{study['best_value']}; target at width {max(WIDTHS)}: {target}")  # fmt: skip
    for run in report["standard_proxy"]:
        lines.append(f"the same study under the standard parametrization, its pick at width "
                     f"{max(WIDTHS)} (seed {run['seed']}): {run['target_value']}")  # fmt: skip
    for goal, figures in report["goals"].items():
        lines.append(f"goal {goal}: {'met' if figures['met'] else 'MISSED'} {figures}")
    return "\n".join(lines)


def _cell(value: float | None, best: bool) -> str:
    if value is None:
        return "-"
    return f"**{value:.4f}**" if best else f"{value:.4f}"
