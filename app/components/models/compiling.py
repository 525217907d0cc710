"""Whether a model runs compiled, compiling it once for the whole run, and counting the graphs.

A run compiles its model once (`maybe_compile`): the probe's compiled confirmation and the run
train the same compiled module, so the graphs the probe compiles are the run's. Its batch
dimension is dynamic (`torch._dynamo.maybe_mark_dynamic` on dimension 0 of every input
tensor, before each call): the last micro-batch of an uneven split (32 = 11 + 11 + 10), the
evaluation micro-batch, an adaptive batch's growth and OOM recovery's halving then reuse the
graph rather than each compiling one of their own. Sizes 0 and 1 stay specialized (dynamo's
rule), so a run at micro-batch 1 compiles static graphs. What a run needs is then one graph
for training and one for evaluation (`model.eval()` under no_grad is another guard set).

A compilation here is one graph dynamo captured and handed to the backend: dynamo's
`unique_graphs` counter, which a recompilation (a guard that failed: a new shape, a new mode)
also increments and `torch._dynamo.reset()` does not clear. It is private, read in
`graphs_compiled` only (tests/test_compiling.py holds it to that meaning).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from app.components.hardware.config import GpuConfig
    from app.components.models.config import ModelConfig


def compiles(m: ModelConfig, preset: GpuConfig) -> bool:
    """model.compile, or the card's default when it is null."""
    return bool(preset.compile if m.compile is None else m.compile)


def maybe_compile(model: torch.nn.Module, m: ModelConfig, preset: GpuConfig) -> torch.nn.Module:
    """The model compiled with its batch dimension dynamic, or the model itself. Call it once
    per run: each call is a new compiled module whose first call compiles again."""
    if not compiles(m, preset):
        return model
    import torch

    compiled: torch.nn.Module = torch.compile(model, mode=m.compile_mode)  # type: ignore[assignment]
    # A hook of the compiled module runs before dynamo sees the call (OptimizedModule calls
    # its hooks outside the frame it compiles), where marking an input still counts.
    compiled.register_forward_pre_hook(batch_dimension_dynamic, with_kwargs=True)
    return compiled


def batch_dimension_dynamic(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            torch._dynamo.maybe_mark_dynamic(value, 0)


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Compiled modules and functions run as plain PyTorch inside, compiling nothing (the
    FSDP blocks compiled in place too): `torch.compiler.set_stance("force_eager")`."""
    import torch

    with torch.compiler.set_stance("force_eager"):
        yield


def graphs_compiled() -> int:
    """Graphs dynamo compiled in this process so far (see the module's docstring)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
