"""`python -m app.bench --parallel`: DDP and FSDP on 2 ranks (torchrun), with and without the
OOM agreement, beside one process.

Every arm trains the default tiny GPT-2 on the built-in corpus on CPU (gloo), one thread per
rank, at the same effective batch, micro-batch and steps; the arms differ only in
`training.parallelism` and in `training.auto_batch.oom_recovery` (under torchrun the ranks
agree on out-of-memory errors at every phase boundary only while recovery is on:
app/engine/comms/agreement.py). Arms alternate within a round; medians over rounds.

Reported per arm: tokens/s (the run's steady state, summary.json), seconds per optimizer step
derived from it, and each rank's model state (parameters + gradients + optimizer state, counted
on the rank's own tensors) and peak memory. The agreement's cost is the difference in seconds
per step between an arm with it and the same arm without it, divided by the agreements a step
runs: one before each micro-batch's forward and backward, one before the optimizer step and
one after the update (2 x accumulation + 2).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NotRequired, TypedDict

from app.engine.records.summary import Summary

EFFECTIVE, MICRO, RANKS = 32, 2, 2
RUN = [
    "gpu=cpu",
    "training.max_steps=40",
    f"training.effective_batch_size={EFFECTIVE}",
    f"training.micro_batch_size={MICRO}",
    "training.eval_every=40",  # once, at the end: tokens/s is the training steps'
    "training.eval_samples=32",
    "training.log_every=5",
    "training.checkpoint_every=0",
    "training.export=false",
    "training.progress_bar=false",
    "data.num_workers=0",
]
NO_AGREEMENT = "training.auto_batch.oom_recovery=false"
ARMS: dict[str, tuple[int, list[str]]] = {
    "one process": (1, []),
    "ddp, agreement": (RANKS, ["training.parallelism=ddp"]),
    "ddp, no agreement": (RANKS, ["training.parallelism=ddp", NO_AGREEMENT]),
    "fsdp, agreement": (RANKS, ["training.parallelism=fsdp"]),
    "fsdp, no agreement": (RANKS, ["training.parallelism=fsdp", NO_AGREEMENT]),
}


def agreements_per_step(ranks: int) -> int:
    """Agreements one optimizer step runs (see the module's docstring)."""
    accumulation = EFFECTIVE // (MICRO * ranks)
    return 2 * accumulation + 2


class ArmRun(TypedDict):
    """One run of an arm, from its summary.json."""

    tokens_per_sec: float
    tokens_per_step: int
    model_state_bytes: dict[str, int]
    peak_memory_bytes_per_rank: list[int] | None
    world_size: int


class ArmMedians(TypedDict):
    """An arm's medians over its runs."""

    ranks: int
    tokens_per_sec: float
    step_s: float
    agreements_per_step: int
    model_state_mib: float
    peak_mib_per_rank: list[float]
    agreement_us: NotRequired[float]  # the arms with the agreement: its cost, and
    ratio_to_no_agreement: NotRequired[float]  # tokens/s over the arm without it


class ParallelReport(TypedDict):
    run: list[str]
    rounds: int
    arms: dict[str, ArmMedians]
    runs: dict[str, list[ArmRun]]


def run_parallel_bench(extra: list[str], rounds: int = 1) -> ParallelReport:
    runs: dict[str, list[ArmRun]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        for r in range(rounds):
            for name, (ranks, args) in ARMS.items():
                run_dir = Path(tmp, f"{r}-{name.replace(', ', '-').replace(' ', '_')}")
                runs[name].append(run_arm(ranks, [*RUN, *args, *extra], run_dir, tmp))
    arms = {name: summarize(name, rs) for name, rs in runs.items()}
    for name, arm in arms.items():
        if name.endswith(", agreement"):
            off = arms[name.replace(", agreement", ", no agreement")]
            extra_s = arm["step_s"] - off["step_s"]
            arm["agreement_us"] = extra_s / arm["agreements_per_step"] * 1e6
            arm["ratio_to_no_agreement"] = arm["tokens_per_sec"] / off["tokens_per_sec"]
    return {"run": RUN + extra, "rounds": rounds, "arms": arms, "runs": runs}


def run_arm(ranks: int, args: list[str], run_dir: Path, tmp: str) -> ArmRun:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    prefix = [*launcher, f"--nproc_per_node={ranks}"] if ranks > 1 else [sys.executable]
    where = [f"hydra.run.dir={run_dir}", f"data.cache_dir={tmp}/cache"]
    cmd = [*prefix, "-m", "app.train", *args, *where]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    s = Summary.read(run_dir)
    if s.tokens_per_sec is None or s.tokens_per_step is None:
        raise SystemExit(f"{run_dir}/summary.json has no tokens_per_sec: {' '.join(cmd)}")
    return {
        "tokens_per_sec": s.tokens_per_sec,
        "tokens_per_step": s.tokens_per_step,
        "model_state_bytes": s.model_state_bytes,
        "peak_memory_bytes_per_rank": s.peak_memory_bytes_per_rank,
        "world_size": s.world_size,
    }


def summarize(name: str, runs: list[ArmRun]) -> ArmMedians:
    ranks = ARMS[name][0]
    tokens = statistics.median(r["tokens_per_sec"] for r in runs)
    return {
        "ranks": ranks,
        "tokens_per_sec": tokens,
        "step_s": runs[0]["tokens_per_step"] / tokens,
        "agreements_per_step": agreements_per_step(ranks) if name.endswith(", agreement") else 0,
        "model_state_mib": runs[-1]["model_state_bytes"].get("total", 0) / 2**20,
        "peak_mib_per_rank": [p / 2**20 for p in runs[-1]["peak_memory_bytes_per_rank"] or []],
    }


def parallel_table(report: ParallelReport) -> str:
    lines = [
        "| arm | ranks | tokens/s | s/step | vs no agreement | agreements/step | "
        "per agreement | model state per rank | peak per rank |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, a in report["arms"].items():
        ratio = f"{a['ratio_to_no_agreement']:.3f}x" if "ratio_to_no_agreement" in a else ""
        cost = f"{a['agreement_us']:,.0f} us" if "agreement_us" in a else ""
        peaks = ", ".join(f"{p:,.0f}" for p in a["peak_mib_per_rank"])
        lines.append(
            f"| {name} | {a['ranks']} | {a['tokens_per_sec']:,.0f} | {a['step_s']:.3f} | "
            f"{ratio} | {a['agreements_per_step'] or ''} | {cost} | "
            f"{a['model_state_mib']:.2f} MiB | {peaks} MiB |"
        )
    lines.append(f"\nmedians over {report['rounds']} round(s); arms alternate within a round")
    return "\n".join(lines)
