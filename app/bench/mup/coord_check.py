"""`python -m app.bench --coord-check`: μP's coordinate check (Yang et al. 2022, "Tensor
Programs V", section 8; the `mup` package's `get_coord_data`, whose method this follows).

A few AdamW steps of the tiny GPT-2 at widths 64 to 512 (8x) on the built-in corpus, under each
parametrization, built and stepped by the trainer's own code (the family's build, the
optimizer's groups); at each step the mean absolute value of the activations of each layer kind,
averaged over layers and seeds. The number of heads is fixed, so the head width grows with the
model and the attention scale's rule shows (with heads scaling and the head width fixed,
1/d_head and 1/sqrt(d_head) differ by a constant): μP's attention is stated at the base width's
head width (model.mup.base_head_dim), the standard scale there, 1/d_head from it. Under μP every
kind stays flat as the width grows; under the standard parametrization the logits (and what a
too-large update feeds) grow. A rule broken shows as one line that grows: its slope (log size
against log width, at the last step) is the check's number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

KINDS = (
    "embedding",
    "attention logits",
    "attention output",
    "MLP output",
    "block output",
    "logits",
)
RECORDING = "coord_check"  # the attention implementation that records the scores


@dataclass(frozen=True)
class CoordSetup:
    widths: tuple[int, ...] = (64, 128, 256, 512)
    base_width: int = 64
    n_head: int = 4  # fixed: the head width grows with the model's
    n_layer: int = 2
    steps: int = 5
    lr: float = 1e-2  # large enough that a wrong rate shows within a few steps
    optimizer: str = "adamw"
    seeds: tuple[int, ...] = (0, 1, 2)
    batch: int = 8
    seq_len: int = 64
    parametrizations: tuple[str, ...] = ("standard", "mup")


class CoordReport(TypedDict):
    setup: dict[str, object]
    widths: list[int]
    # parametrization -> kind -> one list per step of the mean |activation| at each width
    sizes: dict[str, dict[str, list[list[float]]]]
    # parametrization -> kind -> slope of log size against log width at the last step
    slopes: dict[str, dict[str, float]]


def coord_check(setup: CoordSetup, extra: list[str] | None = None) -> CoordReport:
    """Every width under each parametrization, `extra` Hydra overrides on top of the setup's."""
    register_recording_attention()
    sizes: dict[str, dict[str, list[list[float]]]] = {}
    for p in setup.parametrizations:
        by_width = [_mean_over_seeds(setup, width, p, extra or []) for width in setup.widths]
        sizes[p] = {
            kind: [[w[kind][t] for w in by_width] for t in range(setup.steps)] for kind in KINDS
        }
    slopes = {p: {kind: slope(setup.widths, sizes[p][kind][-1]) for kind in KINDS} for p in sizes}
    return {"setup": asdict(setup), "widths": list(setup.widths), "sizes": sizes, "slopes": slopes}


def slope(widths: tuple[int, ...], sizes: list[float]) -> float:
    """Least-squares slope of log2(size) against log2(width): 0 is flat, 1 grows as the width."""
    xs = [math.log2(w) for w in widths]
    ys = [math.log2(max(s, 1e-30)) for s in sizes]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def _mean_over_seeds(
    setup: CoordSetup, width: int, parametrization: str, extra: list[str]
) -> dict[str, list[float]]:
    runs = [measure(setup, width, parametrization, seed, extra) for seed in setup.seeds]
    return {k: [sum(r[k][t] for r in runs) / len(runs) for t in range(setup.steps)] for k in KINDS}


def overrides(setup: CoordSetup, width: int, parametrization: str, seed: int) -> list[str]:
    return [
        "gpu=cpu",
        f"model.n_embd={width}",
        f"model.n_head={setup.n_head}",
        f"model.n_layer={setup.n_layer}",
        f"model.parametrization={parametrization}",
        f"model.mup.base_width={setup.base_width}",
        f"model.mup.base_head_dim={setup.base_width // setup.n_head}",  # the head width grows
        f"data.seq_len={setup.seq_len}",
        f"training.optimizer={setup.optimizer}",
        f"training.lr={setup.lr}",
        f"training.seed={seed}",
    ]


def measure(
    setup: CoordSetup, width: int, parametrization: str, seed: int, extra: list[str]
) -> dict[str, list[float]]:
    """One model's sizes per kind, one per step: the forward pass of step t sees t updates."""
    import torch

    from app.components.models.families import mup_hidden
    from app.components.optim import OPTIMIZERS
    from app.components.tasks import build_task
    from app.config.compose import compose
    from app.config.schema import load_config

    cfg = load_config(compose("train", [*overrides(setup, width, parametrization, seed), *extra]))
    torch.manual_seed(seed)
    task = build_task(cfg.task)
    data = task.load_data(cfg.data)
    from app.engine.export import transformers_model

    model = transformers_model(task.build_model(cfg.model, data))
    model.set_attn_implementation(RECORDING)
    hidden = mup_hidden(model, cfg.model)
    optimizer = OPTIMIZERS.get(cfg.training.optimizer).create(model, cfg.training, hidden)
    order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(seed))
    sizes: dict[str, list[float]] = {k: [] for k in KINDS}
    for step in range(setup.steps):
        blocks = data.train[order[step * setup.batch : (step + 1) * setup.batch]]
        inputs, targets = task.inputs_and_targets(blocks)
        with recording(model) as seen:
            loss = task.loss_sum(model, inputs, targets) / task.units(targets)
        for kind in KINDS:
            sizes[kind].append(sum(seen[kind]) / len(seen[kind]))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return sizes


# The scores of the forward pass being recorded (None: not recording).
_SCORES: list[float] | None = None


@contextmanager
def recording(model: PreTrainedModel) -> Iterator[dict[str, list[float]]]:
    """The mean |activation| of every module of each kind in one forward pass."""
    global _SCORES
    seen: dict[str, list[float]] = {k: [] for k in KINDS}
    handles = [module.register_forward_hook(_hook(seen[kind])) for kind, module in _modules(model)]
    _SCORES = seen["attention logits"]
    try:
        yield seen
    finally:
        _SCORES = None
        for h in handles:
            h.remove()


def _modules(model: PreTrainedModel) -> Iterator[tuple[str, torch.nn.Module]]:
    yield "embedding", model.get_input_embeddings()
    yield "logits", model.get_output_embeddings()
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("Attention"):
            yield "attention output", module
        elif name.endswith("MLP"):
            yield "MLP output", module
        elif name.endswith(("Block", "DecoderLayer")):
            yield "block output", module


def _hook(into: list[float]) -> Callable[..., None]:
    def hook(module: torch.nn.Module, args: object, output: object) -> None:
        tensor = output[0] if isinstance(output, tuple) else output
        into.append(float(tensor.detach().abs().mean()))  # type: ignore[union-attr]

    return hook


def register_recording_attention() -> None:
    """An attention implementation (transformers' public AttentionInterface) that records the
    mean |score| (q.k x the module's scale, before the mask and softmax), then runs SDPA."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def scores_then_sdpa(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if _SCORES is not None:
            scale = query.size(-1) ** -0.5 if scaling is None else scaling
            _SCORES.append(float((query @ key.transpose(-1, -2)).detach().abs().mean()) * scale)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, **kwargs
        )

    AttentionInterface.register(RECORDING, scores_then_sdpa)
    AttentionMaskInterface.register(RECORDING, sdpa_mask)


def coord_table(report: CoordReport) -> str:
    setup = report["setup"]
    lines = [
        f"widths {setup['widths']}, {setup['n_head']} heads, base width {setup['base_width']}, "
        f"{setup['optimizer']} lr {setup['lr']}, {setup['steps']} steps, seeds {setup['seeds']}",
        "",
        "| parametrization | " + " | ".join(KINDS) + " |",
        "|---|" + "---:|" * len(KINDS),
    ]
    for p, slopes in report["slopes"].items():
        lines.append(f"| {p} | " + " | ".join(f"{slopes[k]:+.2f}" for k in KINDS) + " |")
    lines.append("\nslope of log2 mean |activation| against log2 width at the last step")
    return "\n".join(lines)
