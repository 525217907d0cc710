"""`python -m app.bench`: this trainer vs a bare PyTorch loop vs the transformers Trainer.

The same model, data, batch plan, precision and optimizer recipe are trained by three contenders:

- trainer: `app.engine.runner.run_training` with a composed config (the code path users run);
- bare: the floor, a hand-written loop (plain model, AdamW, autocast, clipping, nothing else)
  with the trainer's process settings (the host malloc policy);
- hf: `transformers.Trainer` + `TrainingArguments` (same batch, accumulation and LR; no eval,
  no logging, no saving), stock: glibc's malloc defaults (`--ablate` times it with ours too).

Each contender runs in its own subprocess, so imports, allocator state and peak RSS of one never
leak into another. On CPU they run in lockstep (app/bench/throughput/lockstep.py), taking turns
step by step so that the drift of a shared machine hits them alike; on GPU one after another, the
order rotated each round. Throughput is steady state (after the warm-up steps), median over rounds.

    python -m app.bench                          # CPU: tiny GPT-2, seq 128, batch 32 (minutes)
    python -m app.bench --profile gpt2_small     # GPU: GPT-2 small, seq 1024, bf16, +/- compile
    python -m app.bench --profile nli_tiny       # CPU: tiny DeBERTa NLI classification, samples/s
    python -m app.bench --ablate                 # speed-up options, one at a time
    python -m app.bench --startup                # `app.train --help` / `--cfg job` latency

Throughput is in the task's unit: tokens/s for causal LM, samples/s for classification (whose
micro-batches are padded per batch; the table adds tokens/s and the share of padding).

Modules: profiles (what to run), schedule (subprocesses: rounds or lockstep), workers (one
contender in a process), tasks (what differs per task: the bare loop's step, the Trainer's
dataset and collator, the unit), clock (step timing inside a worker), report (medians, ratios,
tables), micro (the AdamW step and CLI start-up on their own).
"""
