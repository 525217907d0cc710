"""Causal LM text from rows read through `datasets` (`data.source=datasets`): one document per row.

The rows come from app/components/data/sources/ (JSONL/CSV/Parquet files, a save_to_disk
directory or a hub name); `data.text_column` names the text, a column of strings (rows where it
is null are dropped, with a warning). Without a validation split, `data.val_fraction` of the
rows is held out (a single row is cut in two, as a single text file is). Each split is tokenized
with Dataset.map, batched, in `data.map_num_proc` processes, and flattened into one token stream
with the end-of-document token after each row; app/components/data/lm/tokens.py packs and caches
it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from app.components.data.lm.documents import split_document
from app.components.data.lm.tokenizers import TextTokenizer, TokenStreams, load_tokenizer
from app.components.data.rows import map_processes, open_rows, require_columns, text_rows
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from datasets import Dataset

    from app.components.data.config import DataConfig

# Rows per Dataset.map call and per batch of BPE training text.
BATCH_ROWS = 1000


def row_token_streams(cfg: DataConfig) -> TokenStreams:
    train, val = text_splits(cfg)
    tok = load_tokenizer(cfg, text_batches(train, cfg.text_column))
    return TokenStreams(
        train=encode_rows(train, cfg.text_column, tok, cfg.fixed_map_num_proc),
        val=encode_rows(val, cfg.text_column, tok, cfg.fixed_map_num_proc),
        tokenizer=tok,
    )


def text_splits(cfg: DataConfig) -> tuple[Dataset, Dataset]:
    """(train, validation) `Dataset`s, each checked to be non-empty and to have the text column."""
    rows = open_rows(cfg)
    train = check_text_rows(cfg, rows.train, "train")
    if rows.val is None:
        return hold_out_rows(train, cfg)
    return train, check_text_rows(cfg, rows.val, "validation")


def check_text_rows(cfg: DataConfig, rows: Dataset, split: str) -> Dataset:
    """`rows` checked (not empty, a text column of strings), less those with a null text."""
    if len(rows) == 0:
        raise ConfigError(f"data: the {split} split is empty")
    wanted = [("data.text_column", cfg.text_column)]
    require_columns(rows.column_names, wanted, split)
    return text_rows(rows, wanted, split)


def hold_out_rows(rows: Dataset, cfg: DataConfig) -> tuple[Dataset, Dataset]:
    if len(rows) >= 2:
        parts = rows.train_test_split(test_size=cfg.val_fraction, seed=cfg.seed)
        return parts["train"], parts["test"]
    import datasets

    head, tail = split_document(rows[0][cfg.text_column], cfg.val_fraction, cfg.seq_len)
    column = cfg.text_column
    return datasets.Dataset.from_dict({column: [head]}), datasets.Dataset.from_dict(
        {column: [tail]}
    )


def encode_rows(
    rows: Dataset, column: str, tok: TextTokenizer, num_proc: int | None
) -> torch.Tensor:
    """One int64 stream: each row's tokens followed by the end-of-document token; `num_proc`
    is data.map_num_proc (None: auto)."""
    eos = [] if tok.eos_id is None else [tok.eos_id]

    def encode(batch: dict[str, list]) -> dict[str, list]:
        ids = tok.encode_batch(batch[column])  # strings: text_rows checked the column
        return {"input_ids": [doc + eos for doc in ids]}

    # A file-backed dataset caches the result under its fingerprint: a second run maps nothing.
    encoded = rows.map(
        encode,
        batched=True,
        batch_size=BATCH_ROWS,
        num_proc=map_processes(num_proc, len(rows)),
        remove_columns=rows.column_names,
    )
    # Arrow's flattened list values: no Python list per token.
    ids = encoded.with_format("arrow")[:].column("input_ids").combine_chunks().flatten()
    return torch.tensor(ids.to_numpy(zero_copy_only=False), dtype=torch.int64)  # a writable copy


def text_batches(rows: Dataset, column: str) -> Iterator[list[str]]:
    for batch in rows.iter(batch_size=BATCH_ROWS):
        yield batch[column]
