from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import app.components.data.lm.tokenizers as tokenizers_mod
import app.components.data.lm.tokens as data_mod
import app.components.data.loader as loader_mod
from app.components.data.lm.corpus import generate_corpus
from app.components.data.lm.documents import split_documents
from app.components.data.lm.tokenizers import load_tokenizer, tokenize_documents
from app.components.data.lm.tokens import load_token_data
from app.components.data.loader import (
    StepDataset,
    make_step_loader,
    rank_slice,
    resolve_num_workers,
    step_sample_indices,
    val_batches,
)
from app.components.data.rows import expand_paths
from app.config import ConfigError, DataConfig
from tests.conftest import resolved

pytestmark = pytest.mark.unit


def make_cfg(tmp_path: Path, **overrides):
    overrides.setdefault("builtin_num_docs", 400)
    overrides.setdefault("seq_len", 32)
    return resolved(DataConfig(name="t", cache_dir=str(tmp_path / "cache"), **overrides))


def write_text_files(root: Path, n_files: int = 3, paragraphs: int = 30) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n_files):
        paras = [
            f"file {i} paragraph {j}: the quick brown fox jumps. é ü" for j in range(paragraphs)
        ]
        path = root / f"doc{i}.txt"
        path.write_text("\n\n".join(paras), encoding="utf-8")
        files.append(path)
    return files


def forbid_tokenizing(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("tokenized again: the cache was not used")

    monkeypatch.setattr(data_mod, "tokenize_documents", boom)


# --- corpus ----------------------------------------------------------------------------------


def test_builtin_corpus_is_deterministic_per_seed():
    a = generate_corpus(200, seed=1)
    assert a == generate_corpus(200, seed=1)
    assert a != generate_corpus(200, seed=2)
    assert len(a) == 200 and all(isinstance(d, str) and d for d in a)


# --- packing and splitting -------------------------------------------------------------------


def test_builtin_blocks_shape_and_dtype(tmp_path):
    d = load_token_data(make_cfg(tmp_path))
    for blocks in (d.train, d.val):
        assert blocks.dtype == torch.int64
        assert blocks.ndim == 2 and blocks.shape[1] == 33 and len(blocks) >= 1
        assert int(blocks.min()) >= 0 and int(blocks.max()) < d.vocab_size
    assert d.vocab_size == 256 and d.tokenizer_name == "byte" and d.pad_id is None


def test_accepts_a_plain_dataclass(tmp_path):
    d = load_token_data(
        resolved(DataConfig(name="t", cache_dir=str(tmp_path), builtin_num_docs=100))
    )
    assert d.train.shape[1] == 129


def test_packing_is_lossless_and_splits_do_not_overlap(tmp_path):
    cfg = make_cfg(tmp_path)
    d = load_token_data(cfg)
    docs = generate_corpus(cfg.builtin_num_docs, cfg.seed)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction, cfg.seed, cfg.seq_len)

    assert len(train_docs) + len(val_docs) == len(docs)
    assert len(val_docs) >= round(cfg.val_fraction * len(docs))

    stream = b"".join(doc.encode() + b"\0" for doc in train_docs)
    packed = bytes(d.train.flatten().tolist())
    assert stream.startswith(packed)
    assert len(stream) - len(packed) < cfg.seq_len + 1  # only the ragged tail is dropped

    val_stream = b"".join(doc.encode() + b"\0" for doc in val_docs)
    assert val_stream.startswith(bytes(d.val.flatten().tolist()))


def test_split_is_by_document_index():
    docs = [f"doc {i}" for i in range(100)]
    train, val = split_documents(docs, 0.1, seed=3, seq_len=4)
    assert set(train).isdisjoint(val) and len(train) + len(val) == 100
    assert (train, val) == split_documents(docs, 0.1, seed=3, seq_len=4)
    assert val != split_documents(docs, 0.1, seed=4, seq_len=4)[1]


def test_too_small_corpus_names_seq_len(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.seq_len"):
        load_token_data(make_cfg(tmp_path, builtin_num_docs=20, seq_len=4096))


def test_a_single_document_is_cut_into_a_train_head_and_a_val_tail():
    doc = " ".join(generate_corpus(30, seed=1))
    train, val = split_documents([doc], 0.1, seed=0, seq_len=32)
    assert len(train) == len(val) == 1
    assert doc == train[0] + " " + val[0] or doc == train[0] + val[0]
    assert 0.05 * len(doc) < len(val[0]) < 0.2 * len(doc)


def test_a_short_single_document_keeps_half_for_training():
    train, val = split_documents(["ab " * 20], 0.05, seed=0, seq_len=128)
    assert len(train[0]) >= len(val[0]) > 0


def test_no_documents_is_one_line(tmp_path):
    (tmp_path / "blank.txt").write_text("\n\n  \n")
    cfg = make_cfg(tmp_path, source="text_files", paths=[str(tmp_path / "blank.txt")])
    with pytest.raises(ConfigError, match=r"data\.paths: the files hold no text"):
        load_token_data(cfg)


def test_a_text_file_of_one_document_trains(tmp_path):
    from app.engine.runner import run_training
    from tests.conftest import config, tiny

    # One paragraph: no blank line anywhere, so the file is a single document.
    (tmp_path / "one.txt").write_text(" ".join(generate_corpus(300, seed=4)), encoding="utf-8")
    overrides = tiny(
        tmp_path,
        "data=text_files",
        f"data.paths=[{tmp_path}/one.txt]",
        "data.tokenizer=byte",
        "data.seq_len=32",
        "training.max_steps=30",
        "training.eval_every=10",
        "training.lr=3e-3",
    )
    summary = run_training(config(overrides), tmp_path / "run")
    assert summary.status == "completed"
    assert summary.final_val["loss"] < summary.initial_val["loss"] - 0.5


# --- cache -----------------------------------------------------------------------------------


def test_cache_is_reused_and_seq_len_change_misses(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path)
    first = load_token_data(cfg)
    forbid_tokenizing(monkeypatch)
    again = load_token_data(cfg)
    assert torch.equal(first.train, again.train) and torch.equal(first.val, again.val)
    assert again.vocab_size == first.vocab_size and again.tokenizer_name == first.tokenizer_name

    with pytest.raises(AssertionError, match="tokenized again"):
        load_token_data(make_cfg(tmp_path, seq_len=16))


def test_cache_leaves_no_temp_files(tmp_path):
    load_token_data(make_cfg(tmp_path))
    names = os.listdir(tmp_path / "cache")
    assert len(names) == 1 and names[0].endswith(".pt")


# --- text files and tokenizers ---------------------------------------------------------------


def test_text_files_bad_glob_raises_config_error(tmp_path):
    write_text_files(tmp_path / "txt")
    pattern = str(tmp_path / "nothing" / "*.txt")
    cfg = make_cfg(tmp_path, source="text_files", paths=[str(tmp_path / "txt" / "*.txt"), pattern])
    with pytest.raises(ConfigError, match=r"data\.paths") as info:
        load_token_data(cfg)
    assert pattern in str(info.value) and "\n" not in str(info.value)


def test_text_files_byte_tokenizer(tmp_path):
    write_text_files(tmp_path / "txt")
    cfg = make_cfg(tmp_path, source="text_files", paths=[str(tmp_path / "txt" / "*.txt")])
    d = load_token_data(cfg)
    assert d.train.shape[1] == 33 and len(d.val) >= 1


def test_changed_file_misses_cache(tmp_path, monkeypatch):
    files = write_text_files(tmp_path / "txt")
    cfg = make_cfg(tmp_path, source="text_files", paths=[str(tmp_path / "txt" / "*.txt")])
    load_token_data(cfg)
    files[0].write_text(files[0].read_text() + "\n\na new paragraph", encoding="utf-8")
    forbid_tokenizing(monkeypatch)
    with pytest.raises(AssertionError, match="tokenized again"):
        load_token_data(cfg)


def test_trained_bpe_round_trips_and_is_cached(tmp_path, monkeypatch):
    write_text_files(tmp_path / "txt")
    cfg = make_cfg(
        tmp_path,
        source="text_files",
        paths=[str(tmp_path / "txt" / "*.txt")],
        tokenizer="train",
        tokenizer_vocab_size=300,
    )
    d = load_token_data(cfg)
    assert d.tokenizer_name == "trained-bpe:300"
    assert 257 <= d.vocab_size <= 300 and int(d.train.max()) < d.vocab_size
    bpe_files = list((tmp_path / "cache").glob("bpe-*.json"))
    assert len(bpe_files) == 1

    tok = load_tokenizer(cfg, files=expand_paths(list(cfg.paths)))
    text = "the quick brown fox: ünïcödé, never seen 🦊!"
    (ids,) = tok.encode_batch([text])
    assert tok.decode(ids) == text

    # A second tokenizer load must come from the cache, not train again.
    monkeypatch.setattr(tokenizers_mod, "_train_bpe", lambda *a: pytest.fail("BPE trained again"))
    assert load_tokenizer(cfg, files=expand_paths(list(cfg.paths))).encode_batch([text]) == [ids]


def test_pretrained_tokenizer_from_local_dir(tmp_path):
    from transformers import PreTrainedTokenizerFast

    bpe = tokenizers_mod._train_bpe(generate_corpus(300, seed=0), 300)
    tok_dir = tmp_path / "tok"
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=tokenizers_mod.BPE_EOS).save_pretrained(
        tok_dir
    )

    cfg = make_cfg(tmp_path, tokenizer=str(tok_dir))
    d = load_token_data(cfg)
    assert d.tokenizer_name == str(tok_dir) and d.vocab_size == bpe.get_vocab_size()
    eos = bpe.token_to_id(tokenizers_mod.BPE_EOS)
    assert (d.train == eos).any()  # documents are separated by the tokenizer's EOS


def test_unloadable_tokenizer_names_the_key(tmp_path):
    cfg = make_cfg(tmp_path, tokenizer=str(tmp_path / "no_such_tokenizer_dir"))
    with pytest.raises(ConfigError, match=r"data\.tokenizer"):
        load_token_data(cfg)


def test_tokenize_documents_appends_eos():
    tok = load_tokenizer(resolved(DataConfig(name="t")))
    assert tokenize_documents(["ab", "c"], tok).tolist() == [97, 98, 0, 99, 0]


def test_synthetic_source(tmp_path):
    d = load_token_data(make_cfg(tmp_path, source="synthetic", synthetic_num_tokens=10_000))
    assert d.vocab_size == 256 and d.train.dtype == torch.int64
    assert d.train.shape[1] == 33 and len(d.val) >= 1
    assert len(d.train) + len(d.val) == 10_000 // 33


# --- step sampling ---------------------------------------------------------------------------


def test_step_indices_cover_each_block_once_per_epoch():
    num_blocks, per_step = 10, 5  # exactly two steps per epoch
    for epoch in range(3):
        steps = [
            step_sample_indices(num_blocks, per_step, s, seed=7) for s in (2 * epoch, 2 * epoch + 1)
        ]
        assert sorted(torch.cat(steps).tolist()) == list(range(num_blocks))


def test_step_indices_wrap_across_epochs_and_are_deterministic():
    num_blocks, per_step, seed = 7, 3, 11
    stream = torch.cat([step_sample_indices(num_blocks, per_step, s, seed) for s in range(7)])
    for epoch in range(3):
        assert sorted(stream[epoch * 7 : (epoch + 1) * 7].tolist()) == list(range(7))
    assert not torch.equal(stream[:7], stream[7:14])  # a new permutation each epoch
    loader_mod._epoch_permutation.cache_clear()
    assert torch.equal(step_sample_indices(num_blocks, per_step, 4, seed), stream[12:15])


def test_resume_yields_the_same_items():
    blocks = torch.arange(50 * 9).reshape(50, 9)
    ds = StepDataset(blocks, samples_per_step=8, seed=5)
    kw = dict(num_workers=0, pin_memory=False, persistent_workers=True, prefetch_factor=2)
    full = list(make_step_loader(ds, 0, 20, **kw))
    resumed = list(make_step_loader(StepDataset(blocks, 8, seed=5), 13, 7, **kw))
    assert len(full) == 20 and len(resumed) == 7
    for a, b in zip(full[13:], resumed, strict=True):
        assert torch.equal(a, b)
    assert full[0].shape == (8, 9) and full[0].dtype == blocks.dtype


def test_loader_with_workers_matches_in_process():
    blocks = torch.arange(30 * 5).reshape(30, 5)
    ds = StepDataset(blocks, samples_per_step=4, seed=1)
    kw = dict(pin_memory=False, persistent_workers=True, prefetch_factor=2)
    with_workers = list(make_step_loader(ds, 3, 6, num_workers=2, **kw))
    in_process = list(make_step_loader(ds, 3, 6, num_workers=0, **kw))
    assert all(torch.equal(a, b) for a, b in zip(with_workers, in_process, strict=True))


@pytest.mark.parametrize(("n", "world"), [(32, 4), (10, 3), (7, 7), (9, 2)])
def test_ddp_rank_parts_partition_the_step(n, world):
    blocks = torch.arange(40).unsqueeze(1).repeat(1, 3)
    step = 6
    whole = StepDataset(blocks, n, seed=2)[step]
    parts = [StepDataset(blocks, n, seed=2, rank=r, world_size=world)[step] for r in range(world)]
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
    assert torch.equal(torch.cat(parts), whole)
    assert [len(range(n)[rank_slice(n, r, world)]) for r in range(world)] == sizes


def test_step_dataset_rejects_more_ranks_than_samples():
    with pytest.raises(ValueError, match="world_size"):
        StepDataset(torch.zeros(4, 3, dtype=torch.int64), samples_per_step=2, seed=0, world_size=4)


# --- eval and workers ------------------------------------------------------------------------


def test_val_batches_are_fixed_first_blocks():
    val = torch.arange(10 * 4).reshape(10, 4)
    batches = val_batches(val, batch_size=3, num_batches=2)
    assert [b.tolist() for b in batches] == [val[:3].tolist(), val[3:6].tolist()]
    assert len(val_batches(val, batch_size=4, num_batches=5)) == 3  # runs out: no wrap-around
    assert torch.equal(torch.cat(val_batches(val, 4, 5)), val)


def test_resolve_num_workers(monkeypatch):
    assert resolve_num_workers(3, preset_workers=8) == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert resolve_num_workers(None, preset_workers=4) == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert resolve_num_workers(None, preset_workers=4) == 0
