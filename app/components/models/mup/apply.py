"""μP applied to a model built from `model.*` sizes: when it is built (hidden initializations,
the attention scale, the logits' multiplier) and when its optimizer is (each hidden matrix's
width multiplier, which app/components/optim turns into its group's learning rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.mup import MupRules, attention_scale, widths
from app.components.models.mup.attention import set_attention_scale
from app.components.optim import HiddenMatrices

if TYPE_CHECKING:
    import torch

    from app.components.models.config import ModelConfig


def apply_mup(model: torch.nn.Module, m: ModelConfig, rules: MupRules) -> None:
    """The rules of a fresh model (a checkpoint it resumes from then replaces its weights)."""
    import torch

    w = widths(m, rules)
    with torch.no_grad():  # variance ∝ 1/fan_in: the standard model's at the base width
        for p, fan_in in hidden_matrices(model):
            p.mul_(w.of_fan_in(fan_in) ** -0.5)
    set_attention_scale(model, rules.attention, lambda head_dim: attention_scale(m, head_dim))
    rules.final_norm(model).register_forward_hook(Multiply(m.mup.output_mult / w.mult))


def hidden_rates(model: torch.nn.Module, m: ModelConfig, rules: MupRules) -> HiddenMatrices:
    """Each hidden matrix of the model (as placed: a DDP or FSDP model's own parameters) with
    its width multiplier, for the optimizer's groups."""
    w = widths(m, rules)
    return HiddenMatrices({id(p): w.of_fan_in(fan_in) for p, fan_in in hidden_matrices(model)})


def hidden_matrices(model: torch.nn.Module) -> list[tuple[torch.nn.Parameter, int]]:
    """Every matrix but the embeddings (input-like: token and position embeddings, and the
    readout, tied to the token embeddings or not), with its fan-in."""
    import torch

    inputs = {id(e.weight) for e in model.modules() if isinstance(e, torch.nn.Embedding)}
    readout = getattr(model, "get_output_embeddings", lambda: None)()
    if readout is not None:
        inputs.add(id(readout.weight))
    found: list[tuple[torch.nn.Parameter, int]] = []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.dim() >= 2 and id(p) not in inputs:
                found.append((p, fan_in(module, name)))
    return found


def fan_in(module: torch.nn.Module, name: str) -> int:
    """The inputs a matrix sums over: a Linear's in_features, GPT-2's Conv1D's nx."""
    import torch
    from transformers.pytorch_utils import Conv1D

    if name == "weight" and isinstance(module, torch.nn.Linear):
        return module.in_features
    if name == "weight" and isinstance(module, Conv1D):
        return int(module.nx)
    raise TypeError(f"{type(module).__name__}.{name}: a matrix whose fan-in μP cannot tell")


class Multiply:
    """A forward hook that multiplies a module's output (a plain object: a model holding it
    still deep-copies and pickles)."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output * self.factor
