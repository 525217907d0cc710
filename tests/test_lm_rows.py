"""Causal LM text through `datasets`: JSONL/CSV/Parquet files and save_to_disk directories, the
text column, held-out and given validation splits, Dataset.map in processes, the token cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import app.components.data.lm.rows as lm_rows
from app.components.data.lm.corpus import generate_corpus
from app.components.data.lm.tokens import load_token_data
from app.config import ConfigError, DataConfig
from app.engine.runner import run_training
from tests.conftest import config, resolved, tiny

pytestmark = pytest.mark.unit

# Learnable text in one column, and a decoy column that must never be read.
DECOY = "~~decoy~~"


def _rows(n: int = 300, seed: int = 5) -> dict[str, list]:
    docs = generate_corpus(n, seed)
    return {"body": docs, "other": [DECOY] * n, "n": [len(d) for d in docs]}


def _write(rows: dict[str, list], path: Path) -> Path:
    import datasets

    table = datasets.Dataset.from_dict(rows)
    suffix = path.suffix.lstrip(".")
    if suffix == "jsonl":
        table.to_json(str(path))
    elif suffix in ("csv", "tsv"):
        table.to_csv(str(path), index=False, sep="\t" if suffix == "tsv" else ",")
    else:
        table.to_parquet(str(path))
    return path


def _saved(rows: dict[str, list], path: Path, val: dict[str, list] | None = None) -> Path:
    import datasets

    train = datasets.Dataset.from_dict(rows)
    if val is None:
        train.save_to_disk(str(path))
    else:
        datasets.DatasetDict(
            {"train": train, "validation": datasets.Dataset.from_dict(val)}
        ).save_to_disk(str(path))
    return path


def _cfg(tmp_path: Path, **overrides):
    overrides.setdefault("seq_len", 32)
    overrides.setdefault("text_column", "body")
    return resolved(
        DataConfig(name="t", source="datasets", cache_dir=str(tmp_path / "cache"), **overrides)
    )


def _text(blocks: torch.Tensor) -> str:
    return bytes(blocks.flatten().tolist()).decode("utf-8", errors="replace")


def _forbid_encoding(monkeypatch) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("encoded again: the token cache was not used")

    monkeypatch.setattr(lm_rows, "encode_rows", boom)


# --- training end to end ------------------------------------------------------------------


def _train(tmp_path: Path, *extra: str) -> dict:
    overrides = tiny(
        tmp_path,
        "data=hf_text",
        "data.tokenizer=byte",
        "data.seq_len=32",
        "data.text_column=body",
        "training.max_steps=30",
        "training.eval_every=10",
        "training.lr=3e-3",
        *extra,
    )
    return run_training(config(overrides), tmp_path / "run").to_json()


def test_a_jsonl_file_trains_and_the_loss_falls(tmp_path):
    path = _write(_rows(), tmp_path / "train.jsonl")
    summary = _train(tmp_path, f"data.paths=[{path}]")
    assert summary["status"] == "completed"
    assert summary["final_val_loss"] < summary["initial_val_loss"] - 0.5


def test_a_saved_dataset_trains_and_the_loss_falls(tmp_path):
    path = _saved(_rows(), tmp_path / "saved")
    summary = _train(tmp_path, f"data.dataset={path}")
    assert summary["status"] == "completed"
    assert summary["final_val_loss"] < summary["initial_val_loss"] - 0.5


# --- loading ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_files_of_each_format_load_the_text_column(fmt, tmp_path):
    rows = _rows(120)
    path = _write(rows, tmp_path / f"rows.{fmt}")
    data = load_token_data(_cfg(tmp_path, paths=[str(path)]))
    text = _text(data.train) + _text(data.val)
    assert DECOY not in text  # only data.text_column is read
    assert rows["body"][7][:20] in text or rows["body"][8][:20] in text
    assert len(data.train) > 10 * len(data.val) >= 1  # about val_fraction of the rows held out


def test_the_text_column_is_configurable(tmp_path):
    path = _write(_rows(400), tmp_path / "rows.jsonl")
    data = load_token_data(_cfg(tmp_path, paths=[str(path)], text_column="other"))
    assert set(_text(data.train).replace("\0", "")) == set(DECOY)


def test_a_saved_validation_split_is_the_validation_data(tmp_path):
    val = {"body": ["zebra quartz validation " * 20] * 4}
    path = _saved(_rows(200), tmp_path / "saved", val=val)
    data = load_token_data(_cfg(tmp_path, dataset=str(path)))
    assert "zebra quartz" in _text(data.val)
    assert "zebra quartz" not in _text(data.train)


def test_val_paths_are_the_validation_data(tmp_path):
    train = _write(_rows(200), tmp_path / "train.parquet")
    val = _write({"body": ["zebra quartz validation " * 20] * 4}, tmp_path / "val.parquet")
    data = load_token_data(_cfg(tmp_path, paths=[str(train)], val_paths=[str(val)]))
    assert "zebra quartz" in _text(data.val) and "zebra quartz" not in _text(data.train)


def test_without_a_validation_split_rows_are_held_out_disjointly(tmp_path):
    rows = {"body": [f"row {i:04d} " + "x" * 40 for i in range(400)]}
    path = _saved(rows, tmp_path / "saved")
    data = load_token_data(_cfg(tmp_path, dataset=str(path)))
    ids = lambda blocks: {s[:8] for s in _text(blocks).split("\0") if s.startswith("row ")}  # noqa: E731
    train, val = ids(data.train), ids(data.val)
    assert val and train and train.isdisjoint(val)


def test_a_single_row_is_cut_in_two(tmp_path):
    doc = " ".join(generate_corpus(40, seed=2))
    path = _saved({"body": [doc]}, tmp_path / "one")
    data = load_token_data(_cfg(tmp_path, dataset=str(path)))
    head, tail = _text(data.train), _text(data.val)
    assert len(data.train) >= 1 and len(data.val) >= 1
    assert doc.startswith(head[:200]) and tail[:50] in doc[len(doc) // 2 :]


def test_a_trained_bpe_and_several_processes_give_the_same_tokens(tmp_path):
    path = _write(_rows(200), tmp_path / "rows.jsonl")
    common = dict(paths=[str(path)], tokenizer="train", tokenizer_vocab_size=300)
    one = load_token_data(_cfg(tmp_path / "a", map_num_proc=1, **common))
    two = load_token_data(_cfg(tmp_path / "b", map_num_proc=2, **common))
    assert one.tokenizer_name == "trained-bpe:300" and one.vocab_size == 300
    assert torch.equal(one.train, two.train) and torch.equal(one.val, two.val)


# --- the token cache --------------------------------------------------------------------------


def test_the_cache_is_reused_and_a_changed_saved_dataset_misses(tmp_path, monkeypatch):
    path = _saved(_rows(200), tmp_path / "saved")
    cfg = _cfg(tmp_path, dataset=str(path))
    first = load_token_data(cfg)
    with monkeypatch.context() as m:
        _forbid_encoding(m)
        assert torch.equal(load_token_data(cfg).train, first.train)
        with pytest.raises(AssertionError, match="encoded again"):
            load_token_data(_cfg(tmp_path, dataset=str(path), text_column="other"))
    _saved(_rows(200, seed=6), tmp_path / "saved2")
    import shutil

    shutil.rmtree(path)
    shutil.copytree(tmp_path / "saved2", path)
    assert not torch.equal(load_token_data(cfg).train, first.train)


def test_a_changed_file_misses_the_cache(tmp_path, monkeypatch):
    path = _write(_rows(200), tmp_path / "rows.jsonl")
    cfg = _cfg(tmp_path, paths=[str(path)])
    load_token_data(cfg)
    with path.open("a") as f:
        f.write(json.dumps({"body": "one more row", "other": DECOY, "n": 1}) + "\n")
    _forbid_encoding(monkeypatch)
    with pytest.raises(AssertionError, match="encoded again"):
        load_token_data(cfg)


# --- bad rows: one ConfigError naming the setting ------------------------------------------


def test_a_missing_text_column_names_the_columns_there_are(tmp_path):
    path = _write(_rows(20), tmp_path / "rows.jsonl")
    with pytest.raises(ConfigError, match=r"data\.text_column='txt'.*it has body, other, n"):
        load_token_data(_cfg(tmp_path, paths=[str(path)], text_column="txt"))


def save_empty(path: Path) -> Path:
    import datasets

    features = datasets.Features({"body": datasets.Value("string")})
    # One (empty) shard: with none, load_from_disk cannot open what save_to_disk wrote.
    datasets.Dataset.from_dict({"body": []}, features=features).save_to_disk(
        str(path), num_shards=1
    )
    return path


def test_an_empty_saved_dataset_is_refused(tmp_path):
    path = save_empty(tmp_path / "empty")
    with pytest.raises(ConfigError, match="the train split is empty"):
        load_token_data(_cfg(tmp_path, dataset=str(path)))


def test_a_dataset_path_that_is_not_there_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.dataset=.*no such directory"):
        load_token_data(_cfg(tmp_path, dataset=str(tmp_path / "nope")))


def test_an_unsupported_extension_is_refused(tmp_path):
    (tmp_path / "rows.txt").write_text("some text\n")
    with pytest.raises(
        ConfigError, match=r"data\.paths: .*rows\.txt: unsupported file type '\.txt'"
    ):
        load_token_data(_cfg(tmp_path, paths=[str(tmp_path / "rows.txt")]))


def test_map_processes_follow_the_setting():
    from app.components.data.rows import PARALLEL_MAP_ROWS, map_processes

    assert map_processes(None, 10) is None  # small data: one process starts faster
    assert map_processes(1, PARALLEL_MAP_ROWS) is None
    assert map_processes(3, 10) == 3
    big = map_processes(None, PARALLEL_MAP_ROWS)
    assert big is None or 2 <= big <= 8
