"""The suite's steps, in order of value: what is learned first if the time runs out.

What no loan has measured yet comes first (the bench and the scale-out, then the default run and
the probe under compile, each GPU preset's default), then what the 2026-11-28 loan measured
(docs/gpu-suite/h200.md). The steps fall into parts (`--part N`, `--list`): consecutive steps
whose limits add up to at most PART_S, one device call each, so a 15-minute loan (a machine's
start, one call of at most ten minutes) finishes a part.
"""

from __future__ import annotations

from app.gpu_suite.steps import adaptive, basics, memory, oom, perf, precision, scale
from app.gpu_suite.suite import Step

# A part's steps, limits added up: a 10-minute call less the wheels' install and the machine's
# facts (about half a minute together).
PART_S = 9 * 60

# Limits are for an H100; no step needs more than PART_S.
STEPS = [
    Step(1, "bench", "GPT-2 small: eager and compiled vs bare loop and Trainer", 420, perf.bench),
    Step(2, "default_run", "the default run with gpu=auto precision=auto", 120, basics.default_run),
    Step(3, "scale", "DDP/FSDP with NCCL, an Optuna study, a worker fleet", 225, scale.scale),
    Step(4, "probe", "the micro-batch probe on the card, then a cache hit", 270, memory.probe),
    Step(5, "adaptive", "the adaptive batch vs fixed ones", 120, adaptive.adaptive_batch),
    Step(6, "gpu_tests", "the gpu-marked tests", 75, basics.gpu_tests),
    Step(7, "oom", "a real OOM and its recovery; injected OOMs in every phase", 285, oom.oom),
    Step(8, "precision", "auto, bf16, fp16 (GradScaler), tf32, fp32", 240, precision.precision),
    Step(9, "nvml", "NVML scalars in TensorBoard and the cost of logging", 120, precision.nvml),
    Step(10, "deberta", "NLI DeBERTa-v3-base shape throughput", 135, perf.deberta),
]


def parts(steps: list[Step], budget_s: float = PART_S) -> list[list[Step]]:
    """Consecutive steps packed in order into parts whose limits add up to `budget_s` at most."""
    out: list[list[Step]] = []
    used = budget_s
    for step in steps:
        if used + step.limit_s > budget_s:
            out.append([])
            used = 0.0
        out[-1].append(step)
        used += step.limit_s
    return out
