"""The batch-size study's answer: per effective batch, the steps and samples its best learning
rate needed to reach a target loss, the wall time that takes on this device, and the critical
batch size, read off the curve and predicted by the gradient noise scale.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training") find that the steps S and
samples E a batch size B needs to reach a loss follow

    S = S_min (1 + B_crit / B),   E = E_min (1 + B / B_crit),   i.e. (S/S_min - 1)(E/E_min - 1) = 1

so S is linear in 1/B: a least-squares line through the study's points gives S_min (its
intercept) and S_min * B_crit (its slope). Below B_crit a larger batch cuts the steps nearly in
proportion; above it, it mostly spends more data. The gradient noise scale B_simple
(training.noise_scale, app/engine/records/noise_scale.py) predicts B_crit from inside one run.

A trial whose batch grew (training.batch_schedule=adaptive, searched beside the fixed batches:
`training.batch_schedule: choice(fixed, adaptive)` in the grid) is drawn beside them, one row
per batch it started at, and kept out of the fit: its steps and samples to the target are one
more point on the same plane, to compare with the curve.

Pure: rows in, a typed result out; the sweeper feeds it the study's trials
(hydra_plugins/.../_batch_study.py) and plots it with `plot`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

IMAGE = "batch_size_study.png"


@dataclass(frozen=True)
class BatchTrial:
    """One completed trial of the study, as the analysis needs it."""

    batch: int  # the effective batch
    lr: float  # the learning rate it trained with
    final_loss: float
    curve: list[tuple[int, float]]  # (samples seen, validation loss) at each report
    noise_scale: float | None = None  # B_simple at its end (training.noise_scale)
    samples_per_sec: float | None = None  # this batch's throughput on the device (the probe)
    noise_curve: list[tuple[int, float]] = field(default_factory=list)  # (samples, B_simple)
    # An adaptive batch: (samples seen, batch) where each of its batches began; () when fixed
    phases: tuple[tuple[int, int], ...] = ()

    @property
    def adaptive(self) -> bool:
        return bool(self.phases)

    @property
    def start(self) -> int:
        """The batch it started at."""
        return self.phases[0][1] if self.phases else self.batch

    def steps_to(self, samples: float) -> float:
        """Optimizer steps until `samples` were seen, through its batches."""
        phases = self.phases or ((0, self.batch),)
        steps = 0.0
        for i, (begin, batch) in enumerate(phases):
            end = phases[i + 1][0] if i + 1 < len(phases) else math.inf
            steps += max(0.0, min(samples, end) - begin) / batch
        return steps


@dataclass
class BatchRow:
    """One effective batch: its best learning rate and what it took to reach the target."""

    batch: int
    best_lr: float
    best_loss: float
    samples_to_target: float | None  # None: no learning rate reached it before its last report
    steps_to_target: float | None
    samples_per_sec: float | None
    seconds_to_target: float | None  # samples_to_target / samples_per_sec
    # B_simple of the trial that reached the target first, logged where it reached it (the
    # noise scale grows as the loss falls: it predicts the critical batch at that loss)
    noise_scale: float | None
    # An adaptive batch's row (its batch: where it started): the batches it went through
    batches: list[int] | None = None


@dataclass
class BatchStudyResult:
    target_loss: float
    rows: list[BatchRow]
    # From the curve: S_min, E_min and B_crit = E_min / S_min; None where the fit says the
    # critical batch lies outside the batches tried (`curve_note` says which side).
    steps_min: float | None = None
    samples_min: float | None = None
    critical_batch_curve: float | None = None
    curve_note: str = ""
    critical_batch_noise: float | None = None  # median B_simple of the batches' best trials
    fastest_batch: int | None = None  # the least wall time to the target on this device
    notes: list[str] = field(default_factory=list)
    adaptive: list[BatchRow] = field(default_factory=list)  # by the batch they started at

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def analyse(trials: Sequence[BatchTrial], target_loss: float | None = None) -> BatchStudyResult:
    """The study's answer. `target_loss` null: the lowest loss that three batch sizes (all, if
    fewer) reach before the end of their runs (`default_target`)."""
    by_batch: dict[int, list[BatchTrial]] = {}
    grown: dict[int, list[BatchTrial]] = {}
    for t in trials:
        if math.isfinite(t.final_loss):
            (grown if t.adaptive else by_batch).setdefault(t.start, []).append(t)
    if not by_batch:
        raise ValueError("no completed trial of a fixed batch with a finite loss")
    target = default_target(by_batch) if target_loss is None else target_loss
    rows = [_row(b, ts, target) for b, ts in sorted(by_batch.items())]
    result = BatchStudyResult(target_loss=target, rows=rows)
    result.adaptive = [_row(b, ts, target) for b, ts in sorted(grown.items())]
    _fit(result)
    scales = [r.noise_scale for r in rows if r.noise_scale and r.samples_to_target is not None]
    scales = [s for s in scales if s > 0]
    result.critical_batch_noise = statistics.median(scales) if scales else None
    timed = [r for r in rows if r.seconds_to_target is not None]
    if timed:
        result.fastest_batch = min(timed, key=lambda r: r.seconds_to_target or math.inf).batch
    return result


def default_target(by_batch: dict[int, list[BatchTrial]]) -> float:
    """The lowest loss that min(3, batch sizes) batch sizes reach before their last report: a
    batch that gets there only at the end of its budget would count its whole run. Larger
    batches that do not reach it are past the critical batch size at this data budget."""
    before_end = sorted(
        min(min(loss for _, loss in sorted(t.curve)[:-1] or t.curve) for t in ts)
        for ts in by_batch.values()
    )
    return before_end[min(3, len(before_end)) - 1]


def _row(batch: int, trials: list[BatchTrial], target: float) -> BatchRow:
    """The samples to the target are the least over the batch's learning rates: each batch
    size at its own best rate, as the model asks. Reached only at a trial's last report is not
    reached: the budget, not the batch, would set the figure. An adaptive batch's steps are
    counted through its batches; its samples/s is its first batch's (a floor where a probed
    micro-batch grows with the batch)."""
    best = min(trials, key=lambda t: t.final_loss)
    reached = [
        (s, t) for t in trials if (s := samples_to(sorted(t.curve)[:-1], target)) is not None
    ]
    samples, first = min(reached, key=lambda r: r[0]) if reached else (None, best)
    speed = best.samples_per_sec
    return BatchRow(
        batch=batch,
        best_lr=best.lr,
        best_loss=best.final_loss,
        samples_to_target=samples,
        steps_to_target=None if samples is None else first.steps_to(samples),
        samples_per_sec=speed,
        seconds_to_target=None if samples is None or not speed else samples / speed,
        noise_scale=noise_at(first, samples),
        batches=[b for _, b in best.phases] if best.adaptive else None,
    )


def noise_at(trial: BatchTrial, samples: float | None) -> float | None:
    """The trial's noise scale as last logged at or before `samples` seen (its final value
    where it logged no curve or never reached the target)."""
    if samples is None or not trial.noise_curve:
        return trial.noise_scale
    logged = [v for s, v in sorted(trial.noise_curve) if s <= samples]
    return logged[-1] if logged else trial.noise_curve[0][1]


def samples_to(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """Where a learning curve first reaches `target`, linearly between its reports (at the
    first report if it starts below)."""
    points = sorted(curve)
    for i, (seen, loss) in enumerate(points):
        if loss <= target:
            if i == 0:
                return float(seen)
            before, above = points[i - 1]
            return before + (above - target) / (above - loss) * (seen - before)
    return None


def _fit(result: BatchStudyResult) -> None:
    """S = S_min + S_min * B_crit * (1 / B), least squares over the batches that reached it."""
    points = [(1.0 / r.batch, r.steps_to_target) for r in result.rows if r.steps_to_target]
    if len(points) < 2:
        result.curve_note = "fewer than two batch sizes reached the target"
        return
    xs, ys = [p[0] for p in points], [float(p[1] or 0.0) for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    intercept = my - slope * mx
    largest, smallest = max(r.batch for r in result.rows), min(r.batch for r in result.rows)
    if intercept <= 0:
        result.curve_note = (
            f"steps fall in proportion to the batch up to {largest}: the critical batch size is "
            "above the batches tried"
        )
        return
    if slope <= 0:
        result.curve_note = (
            f"steps do not fall with the batch from {smallest}: the critical batch size is "
            "below the batches tried"
        )
        return
    result.steps_min, result.critical_batch_curve = intercept, slope / intercept
    result.samples_min = intercept * result.critical_batch_curve


def plot(result: BatchStudyResult, path: Path) -> Path:
    """Steps against samples to the target, one point per batch size, with the fitted
    (S/S_min - 1)(E/E_min - 1) = 1 and its asymptotes."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    rows = [r for r in result.rows if r.steps_to_target and r.samples_to_target]
    points = [(float(r.samples_to_target or 0), float(r.steps_to_target or 0)) for r in rows]
    ax.plot([e for e, _ in points], [s for _, s in points], "o", ms=7)
    for r, point in zip(rows, points, strict=True):
        ax.annotate(f"B={r.batch}", point, textcoords="offset points", xytext=(6, 6))
    s_min, e_min, b_crit = result.steps_min, result.samples_min, result.critical_batch_curve
    if s_min and e_min and b_crit:
        lo, hi = min(r.batch for r in rows) / 4, max(r.batch for r in rows) * 4
        grid = [lo * (hi / lo) ** (i / 199) for i in range(200)]
        ax.plot([e_min * (1 + b / b_crit) for b in grid], [s_min * (1 + b_crit / b) for b in grid],
                "-", lw=1.2, label=f"fit: B_crit = {b_crit:.1f} (E_min/S_min)")  # fmt: skip
        ax.axhline(s_min, ls=":", c="gray", lw=0.8, label=f"S_min = {s_min:.0f} steps")
        ax.axvline(e_min, ls="--", c="gray", lw=0.8, label=f"E_min = {e_min:.0f} samples")
    if result.critical_batch_noise:
        ax.plot([], [], " ", label=f"noise scale: B_simple = {result.critical_batch_noise:.1f}")
    for r in result.adaptive:
        if r.steps_to_target and r.samples_to_target:
            path_ = " -> ".join(map(str, r.batches or [r.batch]))
            ax.plot([r.samples_to_target], [r.steps_to_target], "*", ms=13,
                    label=f"adaptive: batch {path_}")  # fmt: skip
    missed = [r.batch for r in result.rows if r.samples_to_target is None]
    if missed:
        ax.plot([], [], " ", label=f"not reached within the budget: B = {missed}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples to reach the target (E)")
    ax.set_ylabel("optimizer steps to reach the target (S)")
    ax.set_title(f"Batch-size study: steps vs samples to val loss {result.target_loss:.4g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def table(result: BatchStudyResult) -> str:
    """The per-batch rows as a Markdown table (the sweep's log, the docs)."""

    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        f"target val loss {result.target_loss:.4f}",
        "| batch | best lr | best loss | samples to target | steps | samples/s | s to target "
        "| noise scale |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in [*result.rows, *result.adaptive]:
        name = f"adaptive {' -> '.join(map(str, r.batches))}" if r.batches else str(r.batch)
        lines.append(
            f"| {name} | {r.best_lr:.3g} | {r.best_loss:.4f} | "
            f"{num(r.samples_to_target, ',.0f')} | {num(r.steps_to_target, ',.1f')} | "
            f"{num(r.samples_per_sec, ',.0f')} | {num(r.seconds_to_target, ',.1f')} | "
            f"{num(r.noise_scale, '.1f')} |"
        )
    curve = (
        f"{result.critical_batch_curve:.1f}" if result.critical_batch_curve else result.curve_note
    )
    noise = num(result.critical_batch_noise, ".1f")
    lines.append(f"critical batch: from the curve {curve}; from the noise scale {noise}")
    if result.fastest_batch is not None:
        lines.append(f"fastest to the target on this device: batch {result.fastest_batch}")
    return "\n".join(lines)
