"""The figures of μP's benches: the coordinate check (size of each layer kind's activations
against the width, a line per step) and the learning-rate transfer (validation loss against the
learning rate, a curve per width), each with the two parametrizations side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.bench.mup.coord_check import CoordReport

NAMES = {"standard": "standard parametrization", "mup": "μP"}


def plot_coord_check(report: CoordReport, path: Path) -> None:
    """A row per parametrization, a panel per layer kind: mean |activation| against the width,
    one line per step."""
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    sizes, widths = report["sizes"], report["widths"]
    kinds = list(next(iter(sizes.values())))
    fig, axes = plt.subplots(
        len(sizes), len(kinds), figsize=(2.6 * len(kinds), 2.6 * len(sizes)), squeeze=False
    )
    for row, (p, by_kind) in zip(axes, sizes.items(), strict=True):
        for ax, kind in zip(row, kinds, strict=True):
            steps = by_kind[kind]
            for t, values in enumerate(steps, start=1):
                ax.plot(widths, values, marker="o", markersize=3, label=f"step {t}",
                        color=plt.cm.viridis(t / len(steps)))  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(widths, [str(w) for w in widths], fontsize=7)
            ax.set_title(f"{NAMES.get(p, p)}\n{kind}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("mean |activation|", fontsize=8)
    axes[-1][0].legend(fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("width (model.n_embd)", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_lr_transfer(
    curves: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]], path: Path, title: str
) -> None:
    """Validation loss against the learning rate, a curve per width, a panel per
    parametrization (`curves`: parametrization -> width -> (lr, loss) points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4.2), squeeze=False)
    for ax, (p, by_width) in zip(axes[0], curves.items(), strict=True):
        widths = sorted(by_width)
        for i, width in enumerate(widths):
            points = sorted(by_width[width])
            colour = plt.cm.plasma(i / max(1, len(widths)))
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3,
                    color=colour, label=f"width {width}")  # fmt: skip
            best = min(points, key=lambda pt: pt[1])
            ax.plot([best[0]], [best[1]], marker="*", markersize=11, color=colour)
        ax.set(xscale="log", xlabel="learning rate (training.lr)", ylabel="validation loss")
        ax.set_title(f"{NAMES.get(p, p)}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
