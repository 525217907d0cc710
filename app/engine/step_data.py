"""The samples of each optimizer step, from a given step to the budget's last: the data loader
a run starts with, and the one it restarts at a step where its batch changes (an adaptive
batch schedule). Either reads the one stream of samples (app/components/data/loader.py), cut by
the budget's phases, so a step sees the samples an uninterrupted run would have seen."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from app.components.tasks.base import TaskData
from app.config.budget import TrainBudget
from app.config.schema import TrainConfig
from app.engine.run import Machine, Samples


@dataclass(frozen=True)
class StepsFrom:
    """What the loader reads, fixed for the run; called with a start step and the budget then in
    force, it gives the steps' samples from there."""

    config: TrainConfig
    machine: Machine
    data: TaskData

    def __call__(self, start_step: int, budget: TrainBudget) -> Iterator[Samples]:
        from app.components.data.loader import StepDataset, make_step_loader, resolve_num_workers

        d, dist = self.config.data, self.machine.dist
        phases = budget.batch_phases
        dataset = StepDataset(
            self.data.train,
            phases.first.batch,
            d.seed,
            rank=dist.rank,
            world_size=dist.world_size,
            lengths=self.data.train_lengths if d.length_grouping else None,
            group_steps=d.group_steps,
            step_span=phases.span,
        )
        on_cuda = self.machine.device.type == "cuda"
        loader = make_step_loader(
            dataset,
            start_step,
            budget.max_steps - start_step,
            num_workers=resolve_num_workers(
                d.fixed_num_workers, self.machine.preset.dataloader_workers
            ),
            pin_memory=on_cuda if d.pin_memory is None else bool(d.pin_memory and on_cuda),
            persistent_workers=d.persistent_workers,
            prefetch_factor=d.prefetch_factor,
        )
        return iter(loader)
