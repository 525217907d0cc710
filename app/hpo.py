"""The trial's contract: what a training run and whatever optimizes it agree on.

- the `Reporter` a run reports to at each evaluation (the loop imports no Optuna: outside a
  sweep the reporter does nothing), `build_reporter` that finds the trial's, and the facts a
  run attaches to its trial (`TrialAttrs`);
- what a run can be scored on (`objectives`: the summary.json keys and the metrics reported at
  evaluations, each with the direction that is better).

The sweeper imports each other thing it uses from its own home: the `hpo` settings
(app.config.hpo), a job config's checks (app.config.jobs), the report and the batch-size study
(app.studies), the GPUs (app.components.hardware), errors and signals (app.core). It names the
reporter's factory in `hpo.reporter` (a dotted path), so nothing here imports the sweeper.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Protocol

# summary.json keys every run writes that a study may optimize, and which way is better. The
# task adds final_val_<metric> for each of its metrics (Metric.final).
RUN_METRICS = {
    "tokens_per_sec": "maximize",
    "mfu": "maximize",
    "final_train_loss": "minimize",
    "peak_memory_bytes": "minimize",
    "wall_time_s": "minimize",
    "device_seconds": "minimize",  # the run's cost: (train + eval time) x devices
}


@dataclass
class TrialAttrs:
    """What a run attaches to its trial (Optuna user attributes), once it ends."""

    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    batch_source: str | None = None  # the plan's: fixed | probed | cached | reduced_after_oom
    effective_batch_size: int | None = None
    lr: float | None = None  # what it trained with: training.lr scaled by lr_scaling
    samples_seen: int | None = None
    noise_scale: float | None = None  # training.noise_scale: B_simple at its end
    # training.batch_schedule=adaptive: its effective batch over its data, one {step, samples,
    # batch} per phase (None for a fixed batch)
    batch_schedule: list[dict[str, int]] | None = None
    # The probe's samples/s for this effective batch on this device: its fastest micro-batch
    # that fits (a trial that ran with a smaller one is still credited with what fits)
    probe_samples_per_sec: float | None = None
    peak_memory_bytes: int | None = None  # several ranks: the largest rank's
    tokens_per_sec: float | None = None
    device_seconds: float | None = None  # this job's (a resumed trial: since its resume)
    run_dir: str | None = None
    status: str | None = None

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_user_attrs(cls, attrs: dict[str, Any]) -> TrialAttrs:
        """A trial's user attributes read back (others, the sweeper's own, left out)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in attrs.items() if k in names})


class Reporter(Protocol):
    def report(self, step: int, metrics: dict[str, float]) -> bool:
        """Record intermediate metrics; return True when the run should stop (pruned)."""
        ...

    def set_attrs(self, attrs: TrialAttrs) -> None:
        """Attach facts about the run (batch plan, run dir, peak memory) to the trial."""
        ...


class NullReporter:
    def report(self, step: int, metrics: dict[str, float]) -> bool:
        return False

    def set_attrs(self, attrs: TrialAttrs) -> None:
        pass


def build_reporter(hpo: object, config: object) -> Reporter:
    """The trial's reporter when the sweeper made this run a trial, else a no-op. `hpo`: the
    run's hpo node (typed, a composed node, or None); `config`: the run's config, handed to the
    factory `hpo.reporter` names."""
    number, path = getattr(hpo, "trial_number", None), getattr(hpo, "reporter", None)
    if number is None or not path:  # not a trial (or another app's hpo node without them)
        return NullReporter()
    module, _, name = str(path).rpartition(".")
    factory = getattr(importlib.import_module(module), name)
    reporter: Reporter = factory(config)
    return reporter


@dataclass(frozen=True)
class Objectives:
    """What a run can be scored on, with the better direction of each."""

    final: dict[str, str]  # summary.json key -> minimize | maximize
    reported: dict[str, str]  # metric reported at each evaluation -> minimize | maximize


def objectives(task: str | None) -> Objectives | None:
    """The objectives of a run of `task` (task_of a job config); None for no task (a sweep of
    another app through this sweeper)."""
    if task is None:
        return None
    from app.components.tasks import TASKS

    metrics = TASKS.get(task).metrics
    final = {m.final: m.direction for m in metrics}
    reported = {**{m.reported: m.direction for m in metrics}, **final}
    return Objectives(final={**final, **RUN_METRICS}, reported=reported)
