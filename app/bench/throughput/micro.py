"""Single pieces timed on their own: the AdamW step, and the start-up of the CLI."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import TypedDict

# ---------------------------------------------------------------------------------------------
# AdamW step alone: end-to-end runs of a tiny model are too noisy on a shared CPU to see it

ADAMW_SHAPES = {  # GPT-2 configs: (vocab, positions, width, layers, heads), timed steps
    "tiny_gpt2": ((256, 256, 128, 2, 4), 50),
    "gpt2_small": ((50304, 1024, 768, 12, 12), 3),
}


class AdamwTime(TypedDict):
    model: str  # whose parameters
    adamw: str  # forloop | foreach | fused
    ms_per_step: float  # median over rounds


class StartupTime(TypedDict):
    command: str
    median_s: float
    min_s: float
    max_s: float
    runs: int


def adamw_step_times(rounds: int) -> list[AdamwTime]:
    """Milliseconds per optimizer step of each AdamW implementation, median over rounds."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    rows: list[AdamwTime] = []
    for name, ((vocab, pos, width, layers, heads), reps) in ADAMW_SHAPES.items():
        config = GPT2Config(
            vocab_size=vocab,
            n_positions=pos,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            bos_token_id=0,
            eos_token_id=0,
        )
        params = list(GPT2LMHeadModel(config).parameters())
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        times: dict[str, list[float]] = {"forloop": [], "foreach": [], "fused": []}
        for _ in range(rounds):
            for impl, samples in times.items():
                if impl == "fused":
                    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
                else:
                    opt = torch.optim.AdamW(params, lr=1e-4, foreach=impl == "foreach")
                opt.step()  # allocates the state outside the timing
                t0 = time.perf_counter()
                for _ in range(reps):
                    opt.step()
                samples.append((time.perf_counter() - t0) / reps * 1000)
        rows += [
            {"model": name, "adamw": k, "ms_per_step": statistics.median(v)}
            for k, v in times.items()
        ]
    return rows


def adamw_table(rows: list[AdamwTime]) -> str:
    lines = ["| parameters of | AdamW | ms per step (median) |", "|---|---|---:|"]
    lines += [f"| {r['model']} | {r['adamw']} | {r['ms_per_step']:.1f} |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Start-up latency of the CLI


def measure_startup(runs: int) -> list[StartupTime]:
    out: list[StartupTime] = []
    for label, extra in (("--help", ["--help"]), ("--cfg job", ["--cfg", "job"])):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "app.train", *extra]
            subprocess.run(cmd, capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        out.append(
            {
                "command": f"python -m app.train {label}",
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "runs": runs,
            }
        )
    return out


def startup_table(rows: list[StartupTime]) -> str:
    lines = ["| command | median s | min s | max s | runs |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| `{r['command']}` | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} "
        f"| {r['runs']} |"
        for r in rows
    ]
    return "\n".join(lines)
