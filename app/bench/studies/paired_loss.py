"""Two runs' final validation losses compared sample by sample: how large a gap the validation
set can tell apart.

A run's final validation loss is a mean over `training.eval_samples` samples, so it carries the
sampling error of that mean: two runs whose losses differ by less than it cannot be ranked by
them. Both runs of a bench are evaluated on the same samples, so the error of their difference
is that of the per-sample differences (a paired comparison), smaller than either loss's own
but, on the tiny corpus's 128 validation blocks, still about as wide as a 1 % goal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from app.components.tasks import build_task
from app.config.compose import compose
from app.config.schema import load_config
from app.engine.saving.checkpoint import list_checkpoints, load_checkpoint


@dataclass(frozen=True)
class PairedGap:
    """`run`'s final validation loss against `reference`'s, relative to the reference's."""

    relative: float  # (loss - reference loss) / reference loss, over the whole validation set
    stderr: float  # the standard error of `relative`, from the per-sample differences
    samples: int  # how many validation samples both were evaluated on


def paired_gap(run: Path, reference: Path) -> PairedGap:
    """Both runs' last checkpoints evaluated on the validation samples they were evaluated on
    (run directories of `python -m app.train`; the same task and data)."""
    ours, theirs = SampleLosses.of(run), SampleLosses.of(reference)
    if ours.per_sample.shape != theirs.per_sample.shape:
        raise ValueError(f"{run} and {reference} were evaluated on different validation sets")
    differences = ours.per_sample - theirs.per_sample
    n = len(differences)
    stderr = float(differences.std()) / math.sqrt(n) if n > 1 else math.inf
    return PairedGap(
        relative=(ours.loss - theirs.loss) / theirs.loss, stderr=stderr / theirs.loss, samples=n
    )


@dataclass(frozen=True)
class SampleLosses:
    """A run's final model on its validation samples: the loss as the run reports it (the
    task's metric over the summed evaluation) and each sample's own."""

    loss: float
    per_sample: torch.Tensor

    @classmethod
    @torch.inference_mode()
    def of(cls, run_dir: Path) -> SampleLosses:
        """The run's last checkpoint, on the samples and settings of the run (its
        .hydra/overrides.yaml)."""
        overrides = OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")
        config = load_config(compose("train", [str(o) for o in overrides]))
        task = build_task(config.task)
        data = task.load_data(config.data)
        model = task.build_model(config.model, data)
        checkpoints = list_checkpoints(run_dir / "checkpoints")
        if not checkpoints:
            raise ValueError(f"{run_dir} has no checkpoint to evaluate")
        model.load_state_dict(load_checkpoint(checkpoints[-1]).model)
        model.eval()
        x, y = task.inputs_and_targets(data.val[: config.training.eval_samples])
        sums = [task.eval_sums(model, xi, yi) for xi, yi in task.micro_batches(x, y, [1] * len(y))]
        return cls(
            loss=task.eval_metrics(torch.stack(sums).sum(0).tolist())["loss"],
            per_sample=torch.tensor([task.eval_metrics(s.tolist())["loss"] for s in sums]),
        )
