"""Bad rows and files through `datasets`, in either task: one ConfigError naming the setting, the
value and what is allowed, before any training (a single class, duplicate label names,
non-string texts, null texts, files whose columns differ, unreadable files, a directory)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.components.data.labelled.texts import load_labelled
from app.components.data.lm.tokens import load_token_data
from app.components.data.rows import expand_paths, file_set, read_files
from app.config import ConfigError, DataConfig, load_config
from tests import procs
from tests.conftest import compose, resolved

pytestmark = pytest.mark.unit

WORDS = ["the", "cat", "dog", "eats", "fish", "runs", "at", "night", "red", "small"]


def _sentence(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _pairs(n: int = 40, labels: tuple = (0, 1)) -> list[dict]:
    return [
        {"text": _sentence(i), "text_pair": _sentence(i + 1, 4), "label": labels[i % len(labels)]}
        for i in range(n)
    ]


def _cfg(tmp_path: Path, paths: list[Path], **overrides):
    """Labelled rows or causal-LM rows (the same DataConfig) from `paths`, byte tokenizer."""
    overrides.setdefault("seq_len", 16)
    return resolved(
        DataConfig(
            name="t",
            source="datasets",
            paths=[str(p) for p in paths],
            tokenizer="byte",
            cache_dir=str(tmp_path / "cache"),
            **overrides,
        )
    )


# --- labels ------------------------------------------------------------------------------------


def test_a_single_class_in_the_training_split_is_refused(tmp_path):
    path = _jsonl(tmp_path / "one.jsonl", _pairs(labels=(0,)))
    with pytest.raises(
        ConfigError,
        match=r"^data\.label_column='label' holds one label \(0\) in the training split; "
        r"allowed: at least 2$",
    ):
        load_labelled(_cfg(tmp_path, [path]), None)


def test_two_classes_load(tmp_path):
    path = _jsonl(tmp_path / "two.jsonl", _pairs(labels=("no", "yes")))
    data = load_labelled(_cfg(tmp_path, [path]), None)
    assert data.label_names == ["no", "yes"]
    assert len(data.train.labels) + len(data.val.labels) == 40


@pytest.mark.parametrize(
    ("labels", "needle"),
    [
        ("[x,x,y]", r"task\.labels=\['x', 'x', 'y'\] names 'x' more than once; allowed: distinct"),
        ("[x]", r"task\.labels=\['x'\] names one label; allowed: at least 2"),
    ],
)
def test_task_labels_must_be_at_least_two_distinct_names(labels, needle, tmp_path):
    cfg = compose(["experiment=nli_tiny", f"task.labels={labels}"])
    with pytest.raises(ConfigError, match=needle):
        load_config(cfg)


def test_the_lm_corpus_with_task_classification_names_the_classification_data(tmp_path):
    cfg = compose(["task=classification", "model=tiny_deberta"])
    with pytest.raises(
        ConfigError,
        match=r"data\.text_column='text' is not a column of the built-in NLI corpus that "
        r"data=tiny_corpus gives task=classification \(premise, hypothesis, label\); labelled "
        r"data: data=tiny_nli, data=mnli",
    ):
        load_config(cfg)


# --- text columns: strings only, nulls dropped in both tasks ---------------------------------


@pytest.mark.parametrize(
    ("value", "kind"), [(5, "int64"), (["a", "b c"], "list of string"), (1.5, "float64")]
)
@pytest.mark.parametrize("task", ["causal_lm", "classification"])
def test_a_text_column_that_is_not_strings_is_refused(task, value, kind, tmp_path):
    rows = [{**r, "text": value} for r in _pairs()]
    path = _jsonl(tmp_path / "rows.jsonl", rows)
    cfg = _cfg(tmp_path, [path])
    load = load_token_data if task == "causal_lm" else lambda c: load_labelled(c, None)
    with pytest.raises(
        ConfigError,
        match=rf"^data\.text_column='text' holds {kind} values in the train split; "
        "allowed: a column of strings$",
    ):
        load(cfg)


def test_a_pair_column_that_is_not_strings_is_refused(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", [{**r, "text_pair": 7} for r in _pairs()])
    with pytest.raises(ConfigError, match=r"^data\.text_pair_column='text_pair' holds int64"):
        load_labelled(_cfg(tmp_path, [path]), None)


def _with_nulls(n: int = 40, every: int = 10) -> list[dict]:
    return [{**r, "text": None} if i % every == 0 else r for i, r in enumerate(_pairs(n))]


def test_classification_drops_rows_with_a_null_text_and_says_how_many(tmp_path, caplog):
    path = _jsonl(tmp_path / "rows.jsonl", _with_nulls())
    with caplog.at_level(logging.WARNING, logger="app.components.data.rows"):
        data = load_labelled(_cfg(tmp_path, [path]), None)
    assert len(data.train.labels) + len(data.val.labels) == 36  # not "None" as a text
    assert "train split: 4 rows with a null data.text_column='text'" in caplog.text


def test_causal_lm_drops_rows_with_a_null_text_and_says_how_many(tmp_path, caplog):
    path = _jsonl(tmp_path / "rows.jsonl", _with_nulls(400))
    with caplog.at_level(logging.WARNING, logger="app.components.data.rows"):
        data = load_token_data(_cfg(tmp_path, [path]))
    assert "train split: 40 rows with a null data.text_column='text'" in caplog.text
    # One end-of-document token per document: 360 rows kept, not 400 (an empty document each).
    eos = (data.train[:, :-1] == 0).sum() + (data.val[:, :-1] == 0).sum()
    assert 300 < int(eos) <= 360


def test_a_text_column_of_nulls_only_is_refused(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", [{"text": None, "n": i} for i in range(5)])
    with pytest.raises(ConfigError, match=r"data\.text_column='text': every row of the train"):
        load_token_data(_cfg(tmp_path, [path]))


# --- files --------------------------------------------------------------------------------


def _write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_files_with_different_columns_name_the_file_that_differs(fmt, tmp_path):
    if fmt == "jsonl":
        good = _jsonl(tmp_path / "good.jsonl", [{"text": "a b", "id": 1}, {"text": "c", "id": 2}])
        other = _jsonl(tmp_path / "nocol.jsonl", [{"content": "x"}])
    else:
        good = _write_csv(tmp_path / "good.csv", "text,id", ["a b,1", "c,2"])
        other = _write_csv(tmp_path / "nocol.csv", "content", ["x"])
    fs = file_set([str(good), str(other)], "data.paths", "train")
    with pytest.raises(
        ConfigError,
        match=rf"^data\.paths: {other} has columns content, not those of {good} \(text, id\)",
    ):
        read_files(fs)


def test_an_unreadable_file_is_named_not_the_first_file(tmp_path, capfd):
    good = _jsonl(tmp_path / "a_good.jsonl", [{"text": "a b"}])
    bad = tmp_path / "b_bad.jsonl"
    bad.write_text('{"text": "a"\n')
    fs = file_set([str(good), str(bad)], "data.paths", "train")
    with pytest.raises(ConfigError, match=rf"^data\.paths: cannot read {bad} as json \(JSON parse"):
        read_files(fs)
    assert capfd.readouterr().err == ""  # the datasets logger said nothing besides


def test_a_directory_in_paths_suggests_a_glob(tmp_path):
    _write_csv(tmp_path / "rows.csv", "text", ["a"])
    with pytest.raises(
        ConfigError,
        match=rf"^data\.paths: no file matches '{tmp_path}' \(a directory\); give a glob such "
        rf"as '{tmp_path}/\*\.csv'$",
    ):
        expand_paths([str(tmp_path)])


@pytest.mark.e2e
def test_invalid_jsonl_on_the_command_line_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"\n')
    proc = procs.train(
        "data=hf_text",
        f"data.paths=[{bad}]",
        "data.seq_len=32",
        "gpu=cpu",
        "training.max_steps=3",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: data.paths: cannot read {bad} as json (JSON parse error")
    assert not (tmp_path / "run" / "checkpoints").exists()
