"""Fakes the tests inject through the engine's seams (a task, step hooks), instead of patching
its internals."""

from __future__ import annotations

from typing import Any

import torch

from app.components.tasks.causal_lm import CausalLM
from app.engine.run import StepHooks


class RecordingLM(CausalLM):
    """The causal LM task, recording the size of every training forward and, when marked by
    `Attempts`, which attempt of which optimizer step it belonged to."""

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.forwards: list[int] = []
        self.attempts: list[tuple[int, list[int]]] = []  # (step, micro-batch sizes)

    def loss_sum(self, model, inputs, targets):
        if torch.is_grad_enabled():
            self.forwards.append(len(inputs))
            if self.attempts:
                self.attempts[-1][1].append(len(inputs))
        return super().loss_sum(model, inputs, targets)


class Attempts(StepHooks):
    """Marks the start of each attempt at an optimizer step in the run's RecordingLM."""

    def on_attempt(self, run, step: int) -> None:
        run.task.attempts.append((step, []))


class MicroBatchFrom(StepHooks):
    """Switches the run to micro-batch `micro` from optimizer step `step` on: a run that had
    that micro-batch from there, to compare with one that got it by OOM recovery."""

    def __init__(self, step: int, micro: int) -> None:
        self.step, self.micro = step, micro

    def on_step_start(self, run, step: int, batch: Any) -> None:
        if step >= self.step and run.plan.micro_batch_size != self.micro:
            run.plan = run.plan.with_micro_batch(self.micro, "fixed")
