"""A model compiled once with its batch dimension dynamic, and the count of the graphs dynamo
compiled (app/components/models/compiling.py: its one read of dynamo's private counters is
held to its meaning here)."""

from __future__ import annotations

import pytest
import torch

from app.components.hardware.config import GpuConfig
from app.components.models.compiling import compiles, eager, graphs_compiled, maybe_compile
from app.components.models.config import ModelConfig

pytestmark = pytest.mark.unit


class Doubler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * 2


def compiled_doubler() -> torch.nn.Module:
    return maybe_compile(Doubler(), ModelConfig(compile=True), GpuConfig())


def test_compiles_follows_the_setting_then_the_preset():
    assert compiles(ModelConfig(compile=None), GpuConfig(compile=True))
    assert not compiles(ModelConfig(compile=False), GpuConfig(compile=True))
    assert compiles(ModelConfig(compile=True), GpuConfig(compile=False))
    model = Doubler()
    assert maybe_compile(model, ModelConfig(compile=False), GpuConfig()) is model


def test_the_count_is_one_per_graph_a_recompilation_included_and_a_reset_keeps_it(dynamo_only):
    double = torch.compile(lambda x: x * 2)
    before = graphs_compiled()
    double(torch.ones(3, 2))
    assert graphs_compiled() - before == 1
    double(torch.ones(3, 2))  # the same guards: the graph is reused
    assert graphs_compiled() - before == 1
    double(torch.ones(3, 2, dtype=torch.float64))  # a guard fails: compiled again
    assert graphs_compiled() - before == 2
    torch._dynamo.reset()
    assert graphs_compiled() - before == 2


def test_every_batch_size_trains_and_evaluates_on_one_graph_each(dynamo_only):
    model = compiled_doubler()
    before = graphs_compiled()
    for n in (8, 8, 7, 3, 16):  # an uneven split's last micro-batch, a grown or halved batch
        model(torch.ones(n, 4)).sum().backward()
    assert graphs_compiled() - before == 1
    model.eval()
    with torch.inference_mode():
        for n in (32, 5):
            model(torch.ones(n, 4))
    assert graphs_compiled() - before == 2


def test_without_the_dynamic_batch_a_new_size_compiles_again(dynamo_only):
    """What the hook spares: dynamo's own rule compiles a graph per new size until it has
    seen two (then a dynamic one)."""
    plain = torch.compile(Doubler())
    before = graphs_compiled()
    for n in (8, 7):
        plain(torch.ones(n, 4))
    assert graphs_compiled() - before == 2


def test_eager_runs_a_compiled_module_without_compiling(dynamo_only):
    model = compiled_doubler()
    before = graphs_compiled()
    with eager():
        for n in (1, 2, 4):
            model(torch.ones(n, 4))
    assert graphs_compiled() == before
    model(torch.ones(2, 4))
    assert graphs_compiled() - before == 1
