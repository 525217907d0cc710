"""model=pretrained: the data groups default to the model's own tokenizer, and a checkpoint that
cannot serve the run (too few positions, too small a vocabulary) is one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.components.data.lm.tokens import load_token_data
from app.config import ConfigError
from app.engine.runner import run_training
from tests import procs
from tests.conftest import compose, config, save_tiny_gpt2, tiny

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpt2_bpe(tmp_path_factory) -> Path:
    """A GPT-2 of 64 positions with its own byte-level BPE (ids >= 256 are merges)."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("pretrained") / "gpt2")


def test_the_default_data_feeds_a_bpe_model_its_own_tokenizer(gpt2_bpe, tmp_path):
    from transformers import AutoTokenizer

    cfg = config(tiny(tmp_path, "model=pretrained", f"model.path={gpt2_bpe}"))
    assert cfg.data.tokenizer == str(gpt2_bpe)
    data = load_token_data(cfg.data)
    own = AutoTokenizer.from_pretrained(gpt2_bpe)
    assert data.vocab_size == len(own)
    assert int(data.train.max()) >= 256  # merges: the byte tokenizer never makes such ids
    summary = run_training(cfg, tmp_path / "run")
    assert summary.status == "completed" and summary.warnings == []


def test_a_model_trained_from_scratch_keeps_the_data_groups_tokenizer():
    assert compose([]).data.tokenizer == "byte"
    assert compose(["data=text_files"]).data.tokenizer == "train"
    assert compose(["experiment=nli_tiny"]).data.tokenizer == "train"


def test_another_tokenizer_set_on_purpose_is_a_warning(gpt2_bpe, tmp_path):
    cfg = config(
        tiny(tmp_path, "model=pretrained", f"model.path={gpt2_bpe}", "data.tokenizer=byte")
    )
    summary = run_training(cfg, tmp_path / "run")
    assert summary.status == "completed"
    assert any("is not the tokenizer of model.path" in w for w in summary.warnings)


def _one_line(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.e2e
def test_seq_len_beyond_the_checkpoints_positions_is_one_line_before_work(gpt2_bpe, tmp_path):
    run_dir = tmp_path / "run"
    args = tiny(tmp_path, "model=pretrained", f"model.path={gpt2_bpe}", "data.seq_len=128")
    line = _one_line(procs.train(*args, f"hydra.run.dir={run_dir}"))
    assert "data.seq_len=128 exceeds the 64 positions of model.path=" in line
    assert not run_dir.exists() and not (tmp_path / "cache").exists()


@pytest.mark.e2e
def test_text_files_default_seq_len_against_a_short_checkpoint_is_one_line(gpt2_bpe, tmp_path):
    # data=text_files asks for 512 tokens: this once ended in an IndexError inside the model.
    (tmp_path / "a.txt").write_text("the cat sat on the mat\n\na dog and the cat\n")
    args = ["gpu=cpu", "model=pretrained", f"model.path={gpt2_bpe}", "data=text_files"]
    proc = procs.train(*args, f"data.paths=[{tmp_path}/a.txt]", f"hydra.run.dir={tmp_path / 'run'}")
    assert "data.seq_len=512 exceeds the 64 positions" in _one_line(proc)
    assert not (tmp_path / "run").exists()


def test_a_sweep_trial_is_refused_by_the_same_check(gpt2_bpe, tmp_path):
    # Trials skip preflight: run_training checks again, before writing anything.
    cfg = config(tiny(tmp_path, "model=pretrained", f"model.path={gpt2_bpe}", "data.seq_len=65"))
    with pytest.raises(ConfigError, match=r"data\.seq_len=65 exceeds the 64 positions"):
        run_training(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_a_tokenizer_larger_than_the_embeddings_is_one_line(gpt2_bpe, tmp_path):
    args = tiny(tmp_path, "model=pretrained", f"model.path={gpt2_bpe}", "data.tokenizer=train")
    line = _one_line(procs.train(*args, f"hydra.run.dir={tmp_path / 'run'}"))
    assert "data.tokenizer=train makes 2048 token ids" in line
    assert "use the model's own tokenizer" in line
