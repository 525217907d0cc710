"""The suite's steps, in order of value: what is learned first if the time runs out."""

from __future__ import annotations

from app.gpu_suite.steps import adaptive, basics, memory, oom, perf, precision, scale
from app.gpu_suite.suite import Step

# Limits are for an H100 and add up to 35 minutes, the suite's allowance; no step needs more than
# 9, so any step fits in one 10-minute call of the device.
STEPS = [
    Step(1, "gpu_tests", "the gpu-marked tests", 75, basics.gpu_tests),
    Step(2, "default_run", "the default run with gpu=auto precision=auto", 180, basics.default_run),
    Step(3, "bench", "GPT-2 small: eager and compiled vs bare loop and Trainer", 450, perf.bench),
    Step(4, "probe", "the micro-batch probe on the card, then a cache hit", 270, memory.probe),
    Step(5, "oom", "a real OOM and its recovery; injected OOMs in every phase", 285, oom.oom),
    Step(6, "precision", "auto, bf16, fp16 (GradScaler), tf32, fp32", 240, precision.precision),
    Step(7, "nvml", "NVML scalars in TensorBoard and the cost of logging", 120, precision.nvml),
    Step(8, "scale", "DDP/FSDP with NCCL, an Optuna study, a worker fleet", 225, scale.scale),
    Step(9, "deberta", "NLI DeBERTa-v3-base shape throughput", 135, perf.deberta),
    Step(10, "adaptive", "the adaptive batch vs fixed ones", 120, adaptive.adaptive_batch),
]
