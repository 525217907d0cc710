"""Every model and data source a user can pick runs end to end on CPU."""

from __future__ import annotations

import pytest
import torch

from app.components.models.shape import model_shape
from app.components.tasks import build_task
from app.components.tasks.base import TaskData
from app.config import ConfigError
from app.engine.runner import run_training
from tests.conftest import config, lm_model, tiny

pytestmark = pytest.mark.integration

LLAMA = [
    "model=llama_small",
    "model.n_layer=1",
    "model.n_embd=64",
    "model.n_head=4",
    "model.n_kv_head=2",
    "model.intermediate_size=128",
    "model.max_position_embeddings=64",
]


@pytest.mark.slow
def test_llama_style_model_trains(tmp_path):
    summary = run_training(config(tiny(tmp_path, *LLAMA)), tmp_path / "run")
    assert summary.status == "completed"
    assert summary.final_val["loss"] < summary.initial_val["loss"]


def test_local_pretrained_checkpoint_by_path(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    source = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=300,
            n_positions=64,
            n_embd=32,
            n_layer=1,
            n_head=2,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    source.save_pretrained(tmp_path / "ckpt")  # weights only: the byte tokenizer is chosen
    model_path = f"model.path={tmp_path / 'ckpt'}"
    cfg = config(tiny(tmp_path, "model=pretrained", model_path, "data.tokenizer=byte"))
    model = build_task(cfg.task).build_model(cfg.model, byte_data())
    torch.testing.assert_close(model.lm_head.weight, source.lm_head.weight)
    assert model.config._attn_implementation == "sdpa"
    summary = run_training(cfg, tmp_path / "run")
    assert summary.status == "completed" and summary.num_params > 0


def test_unloadable_pretrained_path_is_a_config_error(tmp_path):
    cfg = config(tiny(tmp_path, "model=pretrained", f"model.path={tmp_path / 'missing'}"))
    with pytest.raises(ConfigError, match=r"model\.path="):
        build_task(cfg.task).build_model(cfg.model, byte_data())


def byte_data() -> TaskData:
    empty = torch.empty(0, dtype=torch.long)
    return TaskData(empty, empty, vocab_size=256, tokenizer_name="byte")


def test_gradient_checkpointing_gives_the_same_step(tmp_path):
    plain = run_training(config(tiny(tmp_path, "training.max_steps=2")), tmp_path / "a")
    ckpt = run_training(
        config(tiny(tmp_path, "training.max_steps=2", "model.gradient_checkpointing=true")),
        tmp_path / "b",
    )
    assert ckpt.final_val["loss"] == pytest.approx(plain.final_val["loss"], rel=1e-5)


@pytest.mark.slow
def test_text_files_with_a_locally_trained_tokenizer(tmp_path):
    from app.components.data.lm.corpus import generate_corpus

    docs = generate_corpus(400, seed=3)
    for i in range(4):
        (tmp_path / f"part{i}.txt").write_text("\n\n".join(docs[i::4]))
    overrides = tiny(
        tmp_path,
        "data=text_files",
        f"data.paths=[{tmp_path}/part*.txt]",
        "data.tokenizer=train",
        "data.tokenizer_vocab_size=400",
        "data.seq_len=32",
    )
    summary = run_training(config(overrides), tmp_path / "run")
    assert summary.status == "completed"
    assert summary.final_val["loss"] < summary.initial_val["loss"]


def test_param_count_excludes_positions_and_counts_tied_weights_once():
    model = lm_model(vocab=100, max_position_embeddings=64)
    total = sum(p.numel() for p in model.parameters())  # parameters() already dedups ties
    assert model_shape(model).num_params == total - 64 * 32
