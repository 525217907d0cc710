"""Documents: what a causal LM's text is cut into before it is tokenized, and held out from.

A document is one generated story (`data.source=builtin`), one paragraph of a text file
(`text_files`; a file of one paragraph is cut in two: its tail is the validation text), or one
row of a text column (`datasets`: app/components/data/lm/rows.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from app.components.data.lm.corpus import CORPUS_VERSION, generate_corpus
from app.components.data.rows import dataset_identity, file_fingerprints
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from app.components.data.config import DataConfig


def read_documents(cfg: DataConfig, files: list[str]) -> list[str]:
    if cfg.source == "builtin":
        return generate_corpus(cfg.builtin_num_docs, cfg.seed)
    docs: list[str] = []
    for path in files:
        # A document is a paragraph: one rule that also gives a single large file a val split.
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        docs.extend(p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip())
    return docs


def split_documents(
    docs: list[str], val_fraction: float, seed: int, seq_len: int
) -> tuple[list[str], list[str]]:
    """Hold out `val_fraction` of the documents (at least enough text for one block).

    A single document is cut in two instead: its tail is the validation text.
    """
    if not docs:
        raise ConfigError(
            "data.paths: the files hold no text (0 documents); give files with some text"
        )
    if len(docs) == 1:
        head, tail = split_document(docs[0], val_fraction, seq_len)
        return [head], [tail]
    order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(val_fraction * len(docs)))
    # Grow the val split until it has roughly one block of text. Characters are a proxy for
    # tokens (the split must precede BPE training); the token count is checked after packing.
    chars = 0
    taken = 0
    while taken < len(docs) - 1 and (taken < n_val or chars < seq_len + 1):
        chars += len(docs[order[taken]]) + 1
        taken += 1
    val_idx = set(order[:taken])
    # Keep corpus order within each split: packing stays readable and tests can rebuild the stream.
    train = [d for i, d in enumerate(docs) if i not in val_idx]
    val = [d for i, d in enumerate(docs) if i in val_idx]
    return train, val


def split_document(text: str, val_fraction: float, seq_len: int) -> tuple[str, str]:
    """(head, tail) of one document: the tail is `val_fraction` of its characters, at least one
    block's worth, at most half. Cut by characters, before tokenizing, so a tokenizer trained on
    the head never sees the validation text."""
    n_val = min(len(text) // 2, max(round(val_fraction * len(text)), seq_len + 1))
    cut = len(text) - n_val
    # Prefer a cut at whitespace (no word split across the two), if one is near and the head
    # stays the larger part.
    space = text.rfind(" ", max(cut - 64, (len(text) + 1) // 2), cut + 1)
    if space > 0:
        cut = space
    return text[:cut], text[cut:].lstrip(" ")


def text_identity(cfg: DataConfig, files: list[str]) -> dict[str, object]:
    """What determines the documents and their train/val split."""
    ident: dict[str, object] = {
        "source": cfg.source,
        "seed": cfg.seed,
        "val_fraction": cfg.val_fraction,
    }
    if cfg.source == "builtin":
        ident.update(num_docs=cfg.builtin_num_docs, corpus_version=CORPUS_VERSION)
    elif cfg.source == "datasets":
        ident.update(rows=dataset_identity(cfg), text_column=cfg.text_column)
    else:
        ident["files"] = file_fingerprints(files)
    return ident
