"""Labelled texts and text pairs for classification: read, map labels to ids, split, tokenize.

Sources (`data.source`):
- `builtin`: the generated NLI corpus (app/components/data/labelled/nli_corpus.py), no download;
- `datasets`: anything the `datasets` library opens: JSONL/JSON, CSV/TSV and Parquet files
  (`data.paths`, and `data.val_paths` for a validation set of their own), a directory written
  by `save_to_disk`, or a hub name where a network exists (`data.dataset`, with
  `data.dataset_config`, `data.train_split`, `data.val_split`), opened by
  app/components/data/sources/.

Columns are configurable (`data.text_column`, `data.text_pair_column` (null for single texts),
`data.label_column`). Text columns must hold strings; rows with a null text are dropped (with a
warning), as for causal LM. The train split must hold at least 2 labels. Labels may be strings
or ints: `task.labels` fixes the names and their order; without it a ClassLabel feature's names
are used, else the sorted string labels of the train split, else 0..max. A split that is missing
is held out from train by `data.val_fraction`. Rows are tokenized once (Dataset.map, batched)
and cached as tensors.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from app.components.data.labelled.columns import text_columns, wanted_columns
from app.components.data.labelled.padded import PaddedRows, pad_rows
from app.components.data.rows import (
    dataset_identity,
    map_processes,
    open_rows,
    require_columns,
    text_rows,
)
from app.core.atomic import atomic_write, atomic_write_text
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from datasets import Dataset, Features
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    from app.components.data.config import DataConfig

log = logging.getLogger(__name__)
CACHE_VERSION = 1
UNLABELLED = -1  # the datasets convention (GLUE test splits): such rows are dropped
SPECIALS = ("[PAD]", "[CLS]", "[SEP]")


@dataclass
class LabelledData:
    train: PaddedRows
    val: PaddedRows
    label_names: list[str]
    vocab_size: int
    tokenizer_name: str
    pad_id: int
    tokenizer: PreTrainedTokenizerBase  # the run saves it with its model


def load_labelled(data_cfg: DataConfig, labels: list[str] | None) -> LabelledData:
    """Read, split, map labels and tokenize as `data_cfg` says (cached by content)."""
    train_rows, val_rows, features = read_splits(data_cfg)
    check_columns(data_cfg, train_rows, "train")
    check_columns(data_cfg, val_rows, "validation")
    names = label_names(data_cfg, train_rows, features, labels)
    check_classes(data_cfg, train_rows)
    tokenizer = load_pair_tokenizer(data_cfg, train_rows)
    key = _cache_key(data_cfg, names, tokenizer)
    path = Path(data_cfg.cache_dir) / f"labelled-{key}.pt"
    if path.is_file():
        cached = torch.load(path, weights_only=True)
        train, val = PaddedRows(**cached["train"]), PaddedRows(**cached["val"])
    else:
        train = tokenize_rows(data_cfg, train_rows, names, tokenizer, "train")
        val = tokenize_rows(data_cfg, val_rows, names, tokenizer, "validation")
        atomic_write(path, lambda f: torch.save({"train": vars(train), "val": vars(val)}, f))
    return LabelledData(
        train=train,
        val=val,
        label_names=names,
        vocab_size=len(tokenizer),
        tokenizer_name=str(data_cfg.tokenizer),
        pad_id=int(tokenizer.pad_token_id),
        tokenizer=tokenizer,
    )


# ---------------------------------------------------------------------------------------------
# Reading


def read_splits(data_cfg: DataConfig) -> tuple[Dataset, Dataset, Features]:
    """(train, validation, the train split's features)."""
    import datasets

    datasets.disable_progress_bars()
    if data_cfg.source == "builtin":
        from app.components.data.labelled.nli_corpus import LABELS, generate_nli

        features = datasets.Features(
            {
                "premise": datasets.Value("string"),
                "hypothesis": datasets.Value("string"),
                "label": datasets.ClassLabel(names=list(LABELS)),  # MNLI's order, not sorted
            }
        )
        generated = generate_nli(data_cfg.builtin_num_docs, data_cfg.seed)
        rows = datasets.Dataset.from_list(generated, features=features)
        train, val = hold_out(rows, data_cfg)
        return train, val, rows.features
    found = open_rows(data_cfg)
    train = usable_rows(data_cfg, found.train, "train")  # before holding out: one warning
    if found.val is None:
        train, val = hold_out(train, data_cfg)
        return train, val, found.features
    return train, usable_rows(data_cfg, found.val, "validation"), found.features


def usable_rows(data_cfg: DataConfig, rows: Dataset, split: str) -> Dataset:
    """Rows read from files or a dataset, checked (columns there, texts strings), less those
    with a null text."""
    check_columns(data_cfg, rows, split)
    return text_rows(rows, text_columns(data_cfg), split)


def hold_out(rows: Dataset, data_cfg: DataConfig) -> tuple[Dataset, Dataset]:
    if len(rows) < 2:
        raise ConfigError(f"data: {len(rows)} labelled row(s); need at least 2 to hold out a split")
    parts = rows.train_test_split(test_size=data_cfg.val_fraction, seed=data_cfg.seed)
    return parts["train"], parts["test"]


def check_columns(data_cfg: DataConfig, rows: Dataset, split: str) -> None:
    if len(rows) == 0:
        raise ConfigError(f"data: the {split} split is empty")
    require_columns(rows.column_names, wanted_columns(data_cfg), split)


# ---------------------------------------------------------------------------------------------
# Labels


def label_names(
    data_cfg: DataConfig, train: Dataset, features: Features | None, given: list[str] | None
) -> list[str]:
    if given:
        return [str(n) for n in given]
    feature = features.get(data_cfg.label_column) if features is not None else None
    names = getattr(feature, "names", None)  # a ClassLabel's
    if names:
        return list(names)
    values = [v for v in set(train[data_cfg.label_column]) if v != UNLABELLED]
    if all(isinstance(v, str) for v in values):
        return sorted(values)
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return [str(i) for i in range(max(values) + 1)]
    raise ConfigError(
        f"data.label_column={data_cfg.label_column!r} holds {sorted(map(repr, values))[:5]}: "
        "labels must be strings or integers >= 0 (set task.labels to name them)"
    )


def check_classes(data_cfg: DataConfig, train: Dataset) -> None:
    """A single class trains to loss 0 and accuracy 1 from the first step: nothing is learned."""
    column = data_cfg.label_column
    present = {v for v in label_values(train, column) if v != UNLABELLED}
    if len(present) < 2:
        held = f"one label ({present.pop()!r})" if present else "no label"
        raise ConfigError(
            f"data.label_column={column!r} holds {held} in the training split; allowed: at least 2"
        )


def label_values(rows: Dataset, column: str) -> list[object]:
    """The column's labels; a ClassLabel's ints as its names, so they keep their meaning when
    task.labels orders (or names) the classes differently."""
    values = list(rows[column])
    names = getattr(rows.features.get(column), "names", None)
    if not names:
        return values
    return [UNLABELLED if v == UNLABELLED else names[v] for v in values]


def label_ids(values: list[object], names: list[str], split: str, column: str) -> list[int]:
    """Label values -> ids in `names`; rows labelled -1 (unlabelled) become -1 (dropped)."""
    index = {name: i for i, name in enumerate(names)}
    out = []
    for value in values:
        if value == UNLABELLED:
            out.append(UNLABELLED)
        elif isinstance(value, str) and value in index:
            out.append(index[value])
        elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
            out.append(value)
        else:
            raise ConfigError(
                f"data.label_column={column!r}: label {value!r} in the {split} split is not one "
                f"of task.labels {names}"
            )
    return out


# ---------------------------------------------------------------------------------------------
# Tokenizing


def load_pair_tokenizer(data_cfg: DataConfig, train: Dataset) -> PreTrainedTokenizerBase:
    """A transformers tokenizer that encodes single texts and pairs with [CLS]/[SEP]:
    `train` (a byte-level BPE trained on the train split and cached), `byte` (bytes only),
    or a local path / hub name (the model's own)."""
    from transformers import PreTrainedTokenizerFast

    if data_cfg.tokenizer in ("train", "byte"):
        vocab = (
            data_cfg.tokenizer_vocab_size if data_cfg.tokenizer == "train" else 256 + len(SPECIALS)
        )
        bpe = _cached_pair_bpe(data_cfg, train, vocab)
        return PreTrainedTokenizerFast(
            tokenizer_object=bpe, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
        )
    from app.components.data.lm.tokens import load_hf_tokenizer

    tok = load_hf_tokenizer(str(data_cfg.tokenizer))
    if tok.pad_token_id is None:
        raise ConfigError(
            f"data.tokenizer={data_cfg.tokenizer!r} has no padding token; classification pads "
            "its batches: use a tokenizer with one (the classifier's own)"
        )
    return tok


def _cached_pair_bpe(data_cfg: DataConfig, train: Dataset, vocab: int) -> Tokenizer:
    from tokenizers import Tokenizer

    texts = _texts(data_cfg, train)
    ident = {"rows": source_identity(data_cfg), "columns": _columns(data_cfg), "vocab": vocab}
    path = Path(data_cfg.cache_dir) / f"pair-bpe-{_hash(ident)}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = _train_pair_bpe(texts, vocab)
    atomic_write_text(path, tok.to_str())
    return tok


def _train_pair_bpe(texts: list[str], vocab: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any later text still encodes
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def _texts(data_cfg: DataConfig, rows: Dataset) -> list[str]:
    texts = list(rows[data_cfg.text_column])
    if data_cfg.text_pair_column:
        texts += list(rows[data_cfg.text_pair_column])
    return texts  # strings: text_rows checked the columns and dropped null texts


def tokenize_rows(
    data_cfg: DataConfig,
    rows: Dataset,
    names: list[str],
    tokenizer: PreTrainedTokenizerBase,
    split: str,
) -> PaddedRows:
    labels = label_ids(
        label_values(rows, data_cfg.label_column), names, split, data_cfg.label_column
    )
    keep = [i for i, label in enumerate(labels) if label != UNLABELLED]
    if not keep:
        raise ConfigError(f"data: the {split} split has no labelled rows")
    if len(keep) < len(labels):
        log.warning(
            "%s split: %d unlabelled rows (label -1) dropped", split, len(labels) - len(keep)
        )
        rows, labels = rows.select(keep), [labels[i] for i in keep]
    pair = data_cfg.text_pair_column

    def encode(batch: dict[str, list]) -> dict[str, list]:
        first = batch[data_cfg.text_column]  # strings: text_rows checked them
        second = batch[pair] if pair else None
        out = tokenizer(
            first,
            second,
            truncation=True,
            max_length=data_cfg.max_length,
            return_token_type_ids=True,
            return_attention_mask=False,
        )
        return {"input_ids": out["input_ids"], "token_type_ids": out["token_type_ids"]}

    # Batched and, for large splits, in several processes; a file-backed dataset caches it.
    procs = map_processes(data_cfg.fixed_map_num_proc, len(rows))
    encoded = rows.map(encode, batched=True, num_proc=procs, remove_columns=rows.column_names)
    types = encoded["token_type_ids"] if pair else None
    return pad_rows(
        encoded["input_ids"], types, labels, data_cfg.max_length, int(tokenizer.pad_token_id)
    )


# ---------------------------------------------------------------------------------------------
# Cache keys


def _hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:20]


def source_identity(data_cfg: DataConfig) -> dict[str, object]:
    """What determines the rows and their split (files by path, size and modification time)."""
    ident: dict[str, object] = {
        "source": data_cfg.source,
        "seed": data_cfg.seed,
        "val_fraction": data_cfg.val_fraction,
    }
    if data_cfg.source == "builtin":
        from app.components.data.labelled.nli_corpus import NLI_VERSION

        ident.update(rows=data_cfg.builtin_num_docs, nli_version=NLI_VERSION)
    else:
        ident.update(dataset_identity(data_cfg))
    return ident


def _columns(data_cfg: DataConfig) -> list[str | None]:
    return [data_cfg.text_column, data_cfg.text_pair_column, data_cfg.label_column]


def _cache_key(data_cfg: DataConfig, names: list[str], tok: PreTrainedTokenizerBase) -> str:
    return _hash(
        {
            "version": CACHE_VERSION,
            "rows": source_identity(data_cfg),
            "columns": _columns(data_cfg),
            "labels": names,
            "max_length": data_cfg.max_length,
            "tokenizer": [
                str(data_cfg.tokenizer),
                len(tok),
                tok.__class__.__name__,
                _vocab_hash(tok),
            ],
        }
    )


def _vocab_hash(tok: PreTrainedTokenizerBase) -> str:
    return _hash(sorted(tok.get_vocab().items()))
