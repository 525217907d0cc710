"""Shared test helpers: tiny configs composed the way Hydra composes them, on CPU."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests import first_run
from tests.procs import ROOT as ROOT  # where tests find the checkout (one home: procs)
from tests.tiers import check_tiers, programs_refused

# Each session is a first run on a new machine (tests/first_run.py): caches of its own, and what
# a library builds once per home by starting a program built here, before the tiers' rule
# (tests/tiers.py) is armed for any test.
first_run.fresh_caches()
first_run.build_once_per_home()

# One thread per process: tests run several trainer processes at once on small machines, where
# two OpenMP threads per process fight over the cores and every step slows down several times.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402 (after the environment it reads)

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Small enough that a whole run takes a few seconds on two shared cores.
TINY = [
    "gpu=cpu",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "model.max_position_embeddings=64",
    "data.seq_len=32",
    "data.builtin_num_docs=300",
    "training.effective_batch_size=8",
    "training.micro_batch_size=4",
    "training.max_steps=6",
    "training.eval_every=3",
    "training.log_every=1",
    "training.eval_samples=8",
    "training.warmup_steps=2",
    "training.progress_bar=false",
]


# For the micro-batch probe and OOM tests: 32 samples per step as 16 x 2 unless a test says
# otherwise (the probe tests ask for training.micro_batch_size=auto themselves).
AUTO_TINY = [
    "gpu=cpu",
    "training.micro_batch_size=16",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "data.seq_len=32",
    "data.builtin_num_docs=300",
    "training.max_steps=6",
    "training.eval_every=3",
    "training.log_every=1",
    "training.progress_bar=false",
]


@pytest.fixture(scope="module")
def shared_data_cache(tmp_path_factory) -> Path:
    # Token caches are keyed by content, so sharing them is safe and saves a corpus build per test.
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture
def cache_dir(shared_data_cache) -> Path:
    """data.cache_dir for one test: shared token data, no micro-batch cache from other tests."""
    shutil.rmtree(shared_data_cache / "autobatch", ignore_errors=True)
    return shared_data_cache


@pytest.fixture
def dynamo_only(monkeypatch):
    """torch.compile with dynamo's "eager" backend (model.compile_mode ignored): graphs are
    captured, guarded and counted as with inductor, but none is compiled to code (inductor
    starts a C++ compiler and its workers: programs, e2e only). Dynamo's caches are dropped
    after the test, so no graph of it is reused by another."""
    real = torch.compile

    def compile_eagerly(model=None, *, mode=None, **kwargs):
        return real(model, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    yield
    torch._dynamo.reset()


def tiny(tmp_path: Path, *extra: str) -> list[str]:
    return [*TINY, f"data.cache_dir={tmp_path / 'cache'}", *extra]


def compose(overrides: list[str]):
    """The composed config (a DictConfig), as Hydra hands it to the entry."""
    from app.config.compose import compose as _compose

    return _compose("train", overrides)


def config(overrides: list[str]):
    """The typed, checked config a run works from (what app.train makes of the command line)."""
    from app.config.schema import load_config

    return load_config(compose(overrides))


def resolved(node):
    """A config dataclass built in a test, with its interpolated defaults resolved as Hydra
    would (data.tokenizer: ${model_tokenizer:byte}, data.cache_dir: ${oc.env:...})."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.structured(node))


def lm_model(vocab: int = 64, **sizes: int):
    """An untrained GPT-2 of the model family the default run builds (tiny unless `sizes`)."""
    from app.components.models.config import ModelConfig
    from app.components.models.families import MODELS
    from app.components.tasks.base import TaskData
    from app.components.tasks.causal_lm import CausalLM

    shape = {"n_layer": 1, "n_head": 2, "n_embd": 32, "max_position_embeddings": 32, **sizes}
    m = ModelConfig(name="t", **shape)
    empty = torch.empty(0, dtype=torch.long)
    return MODELS.get(m.arch).build(m, TaskData(empty, empty, vocab, "test"), CausalLM())


def train_here(*argv: str) -> dict:
    """`python -m app.train ARGV` in this process (runpy does what `-m` does), as the fast tiers
    may start no program: a finished run directory, `.hydra/` included, for tests to read.
    Returns its summary."""
    import json
    import runpy

    run_dir = next(a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir="))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["app.train", *argv])
        runpy.run_module("app.train", run_name="__main__", alter_sys=True)
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    return summary


def invoke_here(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """`python -m app.train ARGV` in this process (runpy does what `-m` does), for a run that
    ends the process: its exit status, stdout and stderr."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["app.train", *argv])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("app.train", run_name="__main__", alter_sys=True)
    captured = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 1), captured.out, captured.err


def save_tiny_gpt2(directory: Path, positions: int = 64, tokenizer: bool = True) -> Path:
    """A small local "pretrained" causal LM: a byte-level BPE of ~300 tokens trained on a few
    sentences (its ids are not bytes) and a GPT-2 of that vocabulary, as save_pretrained
    leaves them. Without `tokenizer` only the model is saved."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(["the cat sat on the mat", "a dog and the cat"] * 20, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=positions,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    GPT2LMHeadModel(config).save_pretrained(directory)
    if tokenizer:
        tok.save_pretrained(directory)
    return directory


def pytest_collection_modifyitems(config, items):
    check_tiers(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with programs_refused(item):  # the fixtures a test asks for are in its tier too
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with programs_refused(item):
        return (yield)
