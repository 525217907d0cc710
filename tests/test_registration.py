"""A task, a model family or a data source adds itself without editing the others: each says
what it needs or provides (a head, a kind of samples, whether it loads a checkpoint, its shape
fields), and the checks and their error lines are computed from that. The fakes here are
registered by the test alone; no list of task names anywhere knows them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from app.bench.throughput.tasks import BENCH_TASKS, TaskBench, benchmarks, strategy_of
from app.components.data.kinds import LABELLED_TEXT, TEXT, SampleKind
from app.components.data.sources import SOURCES, DataSource
from app.components.models.config import ModelConfig
from app.components.models.families import MODELS, ModelFamily, Sizes
from app.components.models.heads import CAUSAL_LM, SEQUENCE_CLASSIFIER, Head
from app.components.tasks import TASKS
from app.components.tasks.base import Task, TaskData
from app.components.tasks.causal_lm import CausalLM
from app.config import ConfigError
from app.engine.start_checks import shape_keys
from tests.conftest import config

pytestmark = pytest.mark.unit

TAGGER = Head("token tagging", "a token tagger")
RANKED = SampleKind("ranked pairs")


class Tagging(CausalLM):
    """A new task with a head no family of the project builds; it reads text."""

    name = "tagging"
    head = TAGGER


class Ranking(CausalLM):
    """A new task that reads samples no source of the project gives."""

    name = "ranking"
    head = CAUSAL_LM
    reads = RANKED


def _never(*args: object) -> None:
    raise AssertionError("not built by the checks")


@pytest.fixture
def fakes(monkeypatch):
    """The fakes, registered as their modules would register themselves (and removed after)."""
    for registry, item in [
        (TASKS, Tagging),
        (TASKS, Ranking),
        (MODELS, ModelFamily("tagger", build=_never, shape=Sizes, heads=(TAGGER,))),
        (SOURCES, DataSource("rank_db", gives=(RANKED,))),
    ]:
        registry.names()  # the project's own first, as a run finds them
        monkeypatch.setitem(registry._items, item.name, item)


def test_a_new_task_is_served_by_what_provides_what_it_needs(fakes, tmp_path):
    cache = f"data.cache_dir={tmp_path}"
    config(["gpu=cpu", cache, "task.name=tagging", "model.arch=tagger"])
    # A family that loads a checkpoint serves any task, and text sources any task reading text.
    assert {"builtin", "text_files"} <= {s.name for s in SOURCES.all() if TEXT in s.gives}
    assert MODELS.get("pretrained").builds(TAGGER)


def test_a_family_without_the_head_names_those_that_have_it(fakes, tmp_path):
    with pytest.raises(ConfigError) as err:
        config(["gpu=cpu", f"data.cache_dir={tmp_path}", "task.name=tagging", "model.arch=gpt2"])
    assert str(err.value) == (
        "model.arch='gpt2' is a causal LM, not a model for task=tagging, which trains a token "
        "tagger; choose one of: pretrained, tagger"
    )


def test_a_source_without_the_samples_names_those_that_give_them(fakes, tmp_path):
    with pytest.raises(ConfigError) as err:
        config(["gpu=cpu", f"data.cache_dir={tmp_path}", "task.name=ranking"])
    assert str(err.value) == (
        "data.source='builtin' does not serve task=ranking, which reads ranked pairs (builtin "
        "gives text or labelled text); choose one of: rank_db"
    )
    config(["gpu=cpu", f"data.cache_dir={tmp_path}", "task.name=ranking", "data.source=rank_db"])


def test_the_project_own_pairs_are_computed_the_same_way(tmp_path):
    """Which families serve which task follows from their heads; the line names those that do
    (examples here, so that a family added serves or not by what it declares)."""
    archs = {f.name for f in MODELS.all() if f.builds(CAUSAL_LM)}
    assert {"gpt2", "pretrained"} <= archs and "bert" not in archs
    sources = {s.name for s in SOURCES.all() if LABELLED_TEXT in s.gives}
    assert "datasets" in sources and "synthetic" not in sources
    classifiers = [f.name for f in MODELS.all() if f.builds(SEQUENCE_CLASSIFIER)]
    assert {"bert", "pretrained"} <= set(classifiers) and "gpt2" not in classifiers
    with pytest.raises(ConfigError) as err:
        config(["gpu=cpu", f"data.cache_dir={tmp_path}", "task=classification", "model=tiny_gpt2"])
    assert str(err.value).endswith(f"a classifier; choose one of: {', '.join(classifiers)}")


def test_a_family_owns_its_shape_fields_and_they_are_model_settings(tmp_path):
    base = ["gpu=cpu", f"data.cache_dir={tmp_path}"]
    gpt2 = shape_keys(config([*base, "model=tiny_gpt2"]))
    llama = shape_keys(config([*base, "model=llama_small"]))
    assert "model.n_kv_head" in llama and "model.n_kv_head" not in gpt2
    assert {"model.n_layer", "model.arch", "task.name", "data.tokenizer"} <= set(gpt2)
    assert MODELS.get("pretrained").shape_keys() == ("model.arch", "model.path")

    @dataclass(frozen=True)
    class Misspelt:
        n_layers: int

    with pytest.raises(TypeError, match="n_layers"):
        ModelFamily("misspelt", build=_never, shape=Misspelt, heads=(CAUSAL_LM,))


def test_a_task_is_benchmarked_by_its_own_strategy_or_that_of_the_task_it_extends(
    fakes, monkeypatch
):
    """A strategy registers itself; a task without one of its own (the tagger, a CausalLM with
    another head) is measured as the task it extends; one that extends none is one line."""
    assert set(BENCH_TASKS) <= set(TASKS.names())
    assert {"causal_lm", "classification"} <= set(BENCH_TASKS)
    assert strategy_of(Tagging) is BENCH_TASKS["causal_lm"]
    monkeypatch.setitem(BENCH_TASKS, "tagging", TaskBench)  # so the test's entry goes after it

    @benchmarks
    class TaggingBench(TaskBench):
        measures = Tagging
        unit = "tokens"

    assert BENCH_TASKS["tagging"] is TaggingBench and strategy_of(Tagging) is TaggingBench

    class Unrelated(Task):  # extends no task that has a strategy: the bench says so in a line
        name = "unrelated"

    assert strategy_of(Unrelated) is None


# A tiny model of any family: sizes every family takes (grouped-query heads where it has them)
TINY_MODEL = {
    "name": "t",
    "n_layer": 2,
    "n_head": 4,
    "n_kv_head": 2,
    "n_embd": 64,
    "max_position_embeddings": 64,
}


def _counted(family: ModelFamily) -> bool:
    return (
        not family.loads_checkpoint
        and family.parameters(ModelConfig(**TINY_MODEL), 100) is not None
    )


@pytest.mark.parametrize("arch", [f.name for f in MODELS.all() if _counted(f)])
def test_a_family_counts_the_parameters_of_the_model_it_builds(arch):
    """Every family that counts its parameters (the memory preflight's figure, before anything
    is built), a new one too: the count is the built model's, tied weights once."""
    family = MODELS.get(arch)
    task = next(t for t in TASKS.all() if family.builds(t.head))()
    m = ModelConfig(arch=arch, **TINY_MODEL)
    empty = torch.empty(0, dtype=torch.long)
    data = TaskData(empty, empty, 100, "test", pad_id=0, info={"labels": ["a", "b", "c"]})
    model = task.build_model(m, data)
    assert family.parameters(m, 100) == sum(p.numel() for p in model.parameters())
