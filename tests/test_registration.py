"""A task, a model family or a data source adds itself without editing the others: each says
what it needs or provides (a head, a kind of samples, whether it loads a checkpoint, its shape
fields), and the checks and their error lines are computed from that. The fakes here are
registered by the test alone; no list of task names anywhere knows them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.bench.throughput.tasks import BENCH_TASKS, TaskBench, benchmarks
from app.components.data.kinds import LABELLED_TEXT, TEXT, SampleKind
from app.components.data.sources import SOURCES, DataSource
from app.components.models.families import MODELS, ModelFamily, Sizes
from app.components.models.heads import CAUSAL_LM, Head
from app.components.tasks import TASKS
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
    for source in ("builtin", "synthetic", "datasets", "text_files"):
        assert TEXT in SOURCES.get(source).gives
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
    archs = [f.name for f in MODELS.all() if f.builds(CAUSAL_LM)]
    assert archs == ["gpt2", "llama", "pretrained"]
    assert [s.name for s in SOURCES.all() if LABELLED_TEXT in s.gives] == ["builtin", "datasets"]
    with pytest.raises(ConfigError, match=r"which trains a classifier; choose one of: bert, "):
        config(["gpu=cpu", f"data.cache_dir={tmp_path}", "task=classification", "model=tiny_gpt2"])


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


def test_every_task_has_a_benchmark_strategy_that_registered_itself(fakes, monkeypatch):
    own = set(TASKS.names()) - {Tagging.name, Ranking.name}
    assert set(BENCH_TASKS) == own == {"causal_lm", "classification"}
    monkeypatch.setitem(BENCH_TASKS, "tagging", TaskBench)  # so the test's entry goes after it

    @benchmarks
    class TaggingBench(TaskBench):
        measures = Tagging
        unit = "tokens"

    assert BENCH_TASKS["tagging"] is TaggingBench
