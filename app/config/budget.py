"""How long a run trains, when it warms up, logs, evaluates and checkpoints, and the learning
rate it trains at: the `training` settings resolved for the run's effective batch, once.

A run's budget is in optimizer steps (`training.max_steps`) or in data (`training.max_samples`,
or `training.max_tokens` for a task whose samples are packed blocks). With none set,
`training.default_budget` says which: 300 steps (`steps`, a single run's default), or the data
300 steps of the reference batch see (`data`, what `hpo=optuna` sets). Two runs of different
effective batches compare fairly only at equal data (Shallue et al. 2018; McCandlish et al.
2018): at equal steps the larger batch has simply seen more. So under a data budget every count
of the schedule is data too. The step counts a config writes
(`warmup_steps`, `eval_every`, `log_every`, `checkpoint_every`, the profiler window) are read as
steps of `training.reference_batch`: `eval_every=25` with reference batch 32 is an evaluation
every 800 samples, i.e. every 100 steps at batch 8 and every 12.5 (the step that crosses the
mark: 13) at batch 64. A run evaluates at the first step at or past each mark and reports the
mark itself to its trial, so every trial of a study is judged at the same data seen. Without a
data budget the counts are steps, as written.

`training.lr_scaling` (none | sqrt | linear) reads `training.lr` as the learning rate at the
reference batch and scales it to the run's effective batch (linear: Goyal et al. 2017, for SGD;
sqrt: Malladi et al. 2022, for Adam-type optimizers).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.config.phases import BatchPhases
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from app.config.training import ProfilerConfig, TrainingConfig

# The budget when none is set: this many optimizer steps (training.default_budget=steps), or
# the data this many steps of training.reference_batch see (=data).
DEFAULT_MAX_STEPS = 300


class BudgetUnit(enum.StrEnum):
    """What a budget, its schedule and a study's report axis count. A str, so summary.json and
    a study's attributes keep the word; compared by identity in the code."""

    STEPS = "steps"
    SAMPLES = "samples"
    TOKENS = "tokens"


# (the setting's name, its unit, the budget in that unit)
Setting = tuple[str, BudgetUnit, int]


@dataclass(frozen=True)
class TrainBudget:
    """One run's schedule at its effective batch. `unit` is what the budget and the report axis
    count (steps, samples or tokens); `per_step` how many of them one optimizer step is at the
    first batch. `phases`: the batch over the steps (one phase unless the batch changes during
    the run, which only a data budget allows); every count here reads them."""

    unit: BudgetUnit
    batch: int  # the effective batch the run starts at: samples per optimizer step, all ranks
    setting: str  # the setting the budget came from: training.max_steps | max_samples | ...
    total: int  # the budget, in `unit`
    per_step: int
    max_steps: int
    warmup_steps: float  # a fraction of steps where the warm-up's data is not whole batches
    eval_every: int  # intervals in `unit`; 0: never (checkpoints only at the end)
    log_every: int
    checkpoint_every: int
    profiler: ProfilerConfig  # its window in steps of this run
    lr: float  # training.lr scaled to this batch
    lr_factor: float  # lr / training.lr
    tokens_per_sample: int | None = None  # packed blocks: every sample's tokens
    # What the LR schedule reads besides the steps (app/components/schedule.py)
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    lr_scaling: str = "none"
    reference_batch: int = 32
    phases: BatchPhases | None = None  # None: one phase at `batch`, set once below

    def __post_init__(self) -> None:
        # Once, not at each read: every count of every step reads the phases.
        if self.phases is None:
            object.__setattr__(self, "phases", BatchPhases.fixed(self.batch))

    @property
    def batch_phases(self) -> BatchPhases:
        assert self.phases is not None  # set in __post_init__
        return self.phases

    # -- where a step falls ---------------------------------------------------------------------

    def seen(self, done: int) -> int:
        """Data (in `unit`) seen after `done` optimizer steps."""
        if self.unit is BudgetUnit.STEPS:
            return done
        samples = self.samples_seen(done)
        return samples * self._tokens if self.unit is BudgetUnit.TOKENS else samples

    def samples_seen(self, done: int) -> int:
        return self.batch_phases.samples_seen(done)

    def tokens_seen(self, done: int) -> int | None:
        """None where samples vary in length (padded)."""
        return self.samples_seen(done) * self.tokens_per_sample if self.tokens_per_sample else None

    def batch_at(self, step: int) -> int:
        """The effective batch optimizer step `step` (0-based) trains at."""
        return self.batch_phases.batch_at(step)

    def position(self, step: int) -> float:
        """Where the schedule is after `step` steps, in steps of the first batch: the data seen
        over the first batch (exactly `step` while the batch has not changed), so the learning
        rate's warm-up and decay follow the data whatever the batch does."""
        return self.samples_seen(step) / self.batch

    def lr_scale(self, step: int) -> float:
        """The learning rate of step `step` over the first batch's: training.lr_scaling applied
        to the batch it trains at (1 while the batch has not changed)."""
        at = self.batch_at(step)
        if at == self.batch:
            return 1.0
        ref = self.reference_batch
        return lr_factor(self.lr_scaling, at, ref) / lr_factor(self.lr_scaling, self.batch, ref)

    def with_batch_from(self, step: int, batch: int) -> TrainBudget:
        """This budget with the effective batch `batch` from optimizer step `step` on (a data
        budget only): the steps it takes to the budget follow."""
        return self.with_phases(self.batch_phases.with_batch_from(step, batch))

    def with_phases(self, phases: BatchPhases) -> TrainBudget:
        """This budget over `phases` (a data budget only; they start at its batch)."""
        if self.unit is BudgetUnit.STEPS:
            raise ValueError("a budget in steps cannot change its batch: the data would change")
        if phases.first.batch != self.batch:
            raise ValueError(f"the phases start at batch {phases.first.batch}, not {self.batch}")
        return dataclasses.replace(self, phases=phases, max_steps=phases.steps_to(self._samples))

    @property
    def schedule_steps(self) -> int:
        """Where the learning-rate schedule ends, in steps of the first batch: the steps the
        budget takes at that batch (max_steps while it does not change; a change leaves it)."""
        if self.unit is BudgetUnit.STEPS:
            return self.max_steps
        return math.ceil(self._samples / self.batch)

    @property
    def _samples(self) -> int:
        """A data budget in samples (the fewest that hold its tokens)."""
        return math.ceil(self.total / (self._tokens if self.unit is BudgetUnit.TOKENS else 1))

    @property
    def _tokens(self) -> int:
        """Every sample's tokens: set wherever the unit is tokens (budget_of checks it)."""
        return self.tokens_per_sample or 0

    def data_seen(self, done: int) -> dict[str, float]:
        """The data seen after `done` steps as logged metrics: the axis on which runs of
        different batch sizes compare."""
        out = {"data/samples_seen": float(self.samples_seen(done))}
        if (tokens := self.tokens_seen(done)) is not None:
            out["data/tokens_seen"] = float(tokens)
        return out

    def due(self, done: int, every: int) -> bool:
        """Step `done` is the first at or past a multiple of `every` (in `unit`): in steps,
        `done % every == 0`; in data, the step that crosses each mark."""
        if every <= 0 or done <= 0:
            return False
        return self.seen(done) // every > self.seen(done - 1) // every

    def evaluates(self, done: int) -> bool:
        return self.due(done, self.eval_every) or done == self.max_steps

    def logs(self, done: int) -> bool:
        return self.due(done, self.log_every) or done == self.max_steps

    def checkpoints(self, done: int) -> bool:
        return self.due(done, self.checkpoint_every) or done == self.max_steps

    def marks(self, done: int) -> list[int]:
        """Where step `done` reports on the study's axis: each mark it crossed (the same marks
        for every batch size; one step of a large batch may cross several, and a pruner's rung
        may be any of them), the budget itself at the last step."""
        if self.unit is BudgetUnit.STEPS or done == 0:
            return [min(done, self.total)]
        every = self.eval_every
        crossed = range(self.seen(done - 1) // every + 1, self.seen(done) // every + 1)
        out = [k * every for k in crossed if k * every < self.total]
        return [*out, self.total] if done >= self.max_steps else out

    def evaluations_after(self, start: int) -> int:
        """How many of steps start+1 .. max_steps evaluate, counted without a pass."""
        last = self.max_steps
        if start >= last:
            return 0
        every = self.eval_every
        if every <= self.per_step:  # every step crosses a mark
            return last - start
        crossed = self.seen(last) // every - self.seen(start) // every
        return crossed + (0 if self.due(last, every) else 1)

    # -- what the banner and summary.json say ---------------------------------------------------

    def describe(self) -> str:
        """The banner's line: where the steps came from."""
        if self.unit is BudgetUnit.STEPS:
            return f"{self.max_steps:,} steps ({self.setting}) of {self.batch} samples"
        seen = self.seen(self.max_steps)
        over = f", {seen:,} {self.unit} seen" if seen != self.total else ""
        warmup = round(self.warmup_steps * self.per_step)
        return (
            f"{self.total:,} {self.unit} ({self.setting}) = {self.max_steps:,} steps of "
            f"{self.per_step:,} {self.unit}{over}; warm-up {warmup:,} {self.unit} "
            f"({self.warmup_steps:.3g} steps), evaluation every {self.eval_every:,} {self.unit}"
        )


@dataclass(frozen=True)
class ReportAxis:
    """Where a study's trials report: every `every` units up to `last` (the budget), in `unit`
    (the same for every trial of a data budget); pruners place their rungs on it."""

    every: int
    last: int
    unit: BudgetUnit = BudgetUnit.STEPS
    source: str = dataclasses.field(default="", compare=False)  # the setting it came from


def budget_of(t: TrainingConfig, tokens_per_sample: int | None) -> TrainBudget:
    """`t` resolved for its effective batch. `tokens_per_sample`: the exact tokens of every
    sample (packed blocks), None where samples vary in length (max_tokens is refused)."""
    setting, unit, total = _budget_setting(t, tokens_per_sample)
    batch, ref = t.effective_batch_size, t.reference_batch
    tokens = tokens_per_sample or 0  # checked above: set wherever the unit is tokens
    steps = {BudgetUnit.STEPS: 1, BudgetUnit.SAMPLES: batch, BudgetUnit.TOKENS: batch * tokens}
    per_step = steps[unit]

    def interval(steps: int) -> int:
        """A count of reference steps as an interval in `unit`."""
        if unit is BudgetUnit.STEPS:
            return steps
        return steps * ref * (tokens if unit is BudgetUnit.TOKENS else 1)

    def steps_of(warmup: int) -> float:
        """Reference steps as (fractional) steps of this run: the warm-up's data."""
        return warmup if unit is BudgetUnit.STEPS else interval(warmup) / per_step

    def steps_here(steps: int) -> int:
        """A count of reference steps as steps of this run (at least one when asked for)."""
        if unit is BudgetUnit.STEPS or steps == 0:
            return steps
        return max(1, round(steps * ref / batch))

    profiler = dataclasses.replace(
        t.profiler, start_step=steps_here(t.profiler.start_step), steps=steps_here(t.profiler.steps)
    )
    factor = lr_factor(t.lr_scaling, batch, ref)
    return TrainBudget(
        unit=unit,
        batch=batch,
        setting=setting,
        total=total,
        per_step=per_step,
        max_steps=math.ceil(total / per_step),
        warmup_steps=steps_of(t.warmup_steps),
        eval_every=interval(t.eval_every),
        log_every=interval(t.log_every),
        checkpoint_every=interval(t.checkpoint_every),
        profiler=profiler,
        lr=t.lr * factor,
        lr_factor=factor,
        tokens_per_sample=tokens_per_sample,
        schedule=t.schedule,
        min_lr_ratio=t.min_lr_ratio,
        lr_scaling=t.lr_scaling,
        reference_batch=ref,
    )


def check_budget(t: TrainingConfig, tokens_per_sample: int | None) -> None:
    """The budget resolves (one is set; tokens only for packed samples), the profiler's window
    holds a step of it, and the learning rate lr_scaling gives this batch is one the optimizer
    takes."""
    budget = budget_of(t, tokens_per_sample)
    p, last = budget.profiler, budget.max_steps
    if p.steps and p.start_step >= last:
        raise ConfigError(
            f"training.profiler.start_step={t.profiler.start_step} is not a step of this run "
            f"({_length(budget)}); allowed: 0..{_last_start(t, budget)}"
        )
    if budget.lr_factor != 1.0:
        _check_scaled_lr(t, budget)
    if t.batch_schedule == "adaptive":
        _check_adaptive(t, budget)


def _check_adaptive(t: TrainingConfig, budget: TrainBudget) -> None:
    """The adaptive schedule needs a budget in data (a budget in steps would grow with the
    batch), and the rate lr_scaling gives its largest batch must be one the optimizer takes."""
    if budget.unit is BudgetUnit.STEPS:
        raise ConfigError(
            f"training.batch_schedule=adaptive grows the batch as the run goes, so its budget "
            f"must be data, but it is {budget.total} steps ({budget.setting}); allowed: "
            "training.max_samples or training.max_tokens, or training.default_budget=data"
        )
    top = dataclasses.replace(t, effective_batch_size=t.batch_cap, batch_schedule="fixed")
    if lr_factor(t.lr_scaling, t.batch_cap, t.reference_batch) != 1.0:
        try:
            _check_scaled_lr(top, budget_of(top, budget.tokens_per_sample))
        except ConfigError as exc:
            raise ConfigError(f"training.max_effective_batch={t.batch_cap}: {exc}") from None


def _length(budget: TrainBudget) -> str:
    steps = "" if budget.unit is BudgetUnit.STEPS else f": {budget.max_steps} steps"
    return f"{budget.setting}={budget.total}{steps}"


def _last_start(t: TrainingConfig, budget: TrainBudget) -> str:
    """The last profiler start_step of this run, in the unit the setting is read in."""
    if budget.unit is BudgetUnit.STEPS:
        return str(budget.max_steps - 1)
    ref, batch = t.reference_batch, t.effective_batch_size
    s = math.floor(budget.max_steps * batch / ref) + 1
    while s > 0 and max(1, round(s * ref / batch)) >= budget.max_steps:
        s -= 1
    return f"{s} (steps of training.reference_batch={ref})"


def _check_scaled_lr(t: TrainingConfig, budget: TrainBudget) -> None:
    """training.lr is checked as written; the rate scaled to this batch must pass too."""
    from app.components.optim import OPTIMIZERS

    how = (
        f"training.lr_scaling={t.lr_scaling} makes training.lr={t.lr:g} a rate of "
        f"{budget.lr:.4g} at batch {t.effective_batch_size} (reference {t.reference_batch})"
    )
    if budget.lr > 1.0:
        raise ConfigError(f"{how}; allowed: a scaled learning rate in (0, 1]")
    try:
        OPTIMIZERS.get(t.optimizer).check(dataclasses.replace(t, lr=budget.lr))
    except ConfigError as exc:
        raise ConfigError(f"{how}: {exc}") from None


def report_axis(t: TrainingConfig, tokens_per_sample: int | None) -> ReportAxis:
    """The study's report axis for these settings (a data budget's: any effective batch's)."""
    b = budget_of(t, tokens_per_sample)
    return ReportAxis(unit=b.unit, every=b.eval_every, last=b.total, source=b.setting)


def lr_factor(scaling: str, batch: int, reference: int) -> float:
    if scaling == "linear":
        return batch / reference
    if scaling == "sqrt":
        return math.sqrt(batch / reference)
    return 1.0


def _budget_setting(t: TrainingConfig, tokens_per_sample: int | None) -> Setting:
    """(setting, unit, total) of the one budget set; two set together are refused."""
    given = [
        (name, unit, value)
        for name, unit, value in (
            ("training.max_steps", BudgetUnit.STEPS, t.max_steps),
            ("training.max_samples", BudgetUnit.SAMPLES, t.max_samples),
            ("training.max_tokens", BudgetUnit.TOKENS, t.max_tokens),
        )
        if value is not None
    ]
    if len(given) > 1:
        named = " and ".join(f"{name}={value}" for name, _, value in given)
        raise ConfigError(
            f"{named} are two budgets; set one of training.max_steps, training.max_samples, "
            "training.max_tokens (the others null)"
        )
    if not given:
        return _default_budget(t, tokens_per_sample)
    name, unit, value = given[0]
    if unit is BudgetUnit.TOKENS and not tokens_per_sample:
        raise ConfigError(
            f"training.max_tokens={value}: this task's samples vary in length, so a budget in "
            "tokens is not a number of steps; use training.max_samples or training.max_steps"
        )
    return name, unit, int(value)


def _default_budget(t: TrainingConfig, tokens_per_sample: int | None) -> Setting:
    """training.default_budget, when no budget is set: DEFAULT_MAX_STEPS steps, or the data
    that many steps of the reference batch see (tokens for packed blocks, else samples)."""
    setting = f"training.default_budget={t.default_budget}"
    if t.default_budget == "steps":
        return setting, BudgetUnit.STEPS, DEFAULT_MAX_STEPS
    samples = DEFAULT_MAX_STEPS * t.reference_batch
    if tokens_per_sample:
        return setting, BudgetUnit.TOKENS, samples * tokens_per_sample
    return setting, BudgetUnit.SAMPLES, samples
