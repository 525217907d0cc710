"""Tokenizers of causal-LM text: bytes, a BPE trained on the train split (cached), or a
pretrained one by local path or hub name; and a tokenized document stream.

Documents are joined with an end-of-document token: byte 0 for the byte tokenizer (it never
occurs in text, unlike a newline, so a document boundary is unambiguous), `<|endoftext|>` for a
trained BPE, and the tokenizer's EOS (else SEP) for a pretrained one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from app.components.data.lm.documents import text_identity
from app.components.data.rows import file_fingerprints
from app.core.atomic import atomic_write_text
from app.core.errors import ConfigError, first_line

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    from app.components.data.config import DataConfig

BYTE_EOS = 0
BPE_EOS = "<|endoftext|>"


@dataclass
class TextTokenizer:
    name: str
    vocab_size: int
    eos_id: int | None  # appended after every document; None: documents are just concatenated
    pad_id: int | None
    encode_batch: Callable[[list[str]], list[list[int]]]
    decode: Callable[[list[int]], str]


@dataclass
class TokenStreams:
    """Both splits as one token stream each, and the tokenizer that made them."""

    train: torch.Tensor  # int64 [n_train_tokens]
    val: torch.Tensor  # int64 [n_val_tokens]
    tokenizer: TextTokenizer


def load_tokenizer(
    cfg: DataConfig,
    train_docs: Iterable[str] | Iterable[list[str]] | None = None,
    files: list[str] | None = None,
) -> TextTokenizer:
    """`train_docs` is the BPE training text (tokenizer=train): documents, or batches of them;
    `files` goes into its cache key."""
    if cfg.tokenizer == "byte":
        return _byte_tokenizer()
    if cfg.tokenizer == "train":
        return _trained_bpe(cfg, train_docs or [], files or [])
    return pretrained_tokenizer(cfg.tokenizer)


def _byte_tokenizer() -> TextTokenizer:
    return TextTokenizer(
        name="byte",
        vocab_size=256,
        eos_id=BYTE_EOS,
        pad_id=None,
        encode_batch=lambda texts: [list(t.encode("utf-8")) for t in texts],
        decode=lambda ids: bytes(ids).decode("utf-8", errors="replace"),
    )


def _trained_bpe(
    cfg: DataConfig, train_docs: Iterable[str] | Iterable[list[str]], files: list[str]
) -> TextTokenizer:
    if cfg.tokenizer_vocab_size < 257:
        raise ConfigError(
            f"data.tokenizer_vocab_size={cfg.tokenizer_vocab_size} must be >= 257 "
            "(256 byte symbols + the end-of-document token)"
        )
    tok = bpe_tokenizer(cfg, train_docs, files)
    return TextTokenizer(
        name=f"trained-bpe:{cfg.tokenizer_vocab_size}",
        vocab_size=tok.get_vocab_size(),
        eos_id=tok.token_to_id(BPE_EOS),
        pad_id=None,
        encode_batch=lambda texts: [
            e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)
        ],
        decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
    )


def bpe_tokenizer(
    cfg: DataConfig, train_docs: Iterable[str] | Iterable[list[str]], files: list[str]
) -> Tokenizer:
    """The BPE trained on this data's train split: from the cache, else trained and cached."""
    from tokenizers import Tokenizer

    path = bpe_path(cfg, files)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = _train_bpe(train_docs, cfg.tokenizer_vocab_size)
    atomic_write_text(path, tok.to_str())
    return tok


def _train_bpe(texts: Iterable[str] | Iterable[list[str]], vocab_size: int) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOS],
        # All 256 byte symbols, seen or not, so any later text still encodes losslessly.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # A generator of batches (rows of a large dataset) has no length: it only sizes a progress bar.
    length = len(texts) if isinstance(texts, list) else None
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return tok


def bpe_path(cfg: DataConfig, files: list[str]) -> Path:
    return Path(cfg.cache_dir) / f"bpe-{_bpe_cache_key(cfg, files)}.json"


def _bpe_cache_key(cfg: DataConfig, files: list[str]) -> str:
    # Trained on the train split only, so the split settings are part of the key.
    return content_hash({"text": text_identity(cfg, files), "vocab": cfg.tokenizer_vocab_size})


def load_hf_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """A transformers tokenizer by local path or hub name; one line naming data.tokenizer."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # hub/IO/parse errors all mean the same thing to the user
        raise ConfigError(
            f"data.tokenizer={name!r} could not be loaded ({first_line(e)}); use byte, train, "
            "a local tokenizer directory or a hub name available offline"
        ) from e


def pretrained_tokenizer(name: str) -> TextTokenizer:
    tok = load_hf_tokenizer(name)
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id

    def encode_batch(texts: list[str]) -> list[list[int]]:
        # verbose=False: documents longer than model_max_length are fine, we pack them.
        return tok(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def decode(ids: list[int]) -> str:
        text = tok.decode(ids)
        if not isinstance(text, str):  # a list of texts only for a batch of sequences
            raise TypeError(f"{name}: decode gave {type(text).__name__} for one sequence")
        return text

    return TextTokenizer(
        name=name,
        vocab_size=len(tok),
        eos_id=eos,
        pad_id=tok.pad_token_id,
        encode_batch=encode_batch,
        decode=decode,
    )


def tokenize_documents(docs: list[str], tok: TextTokenizer) -> torch.Tensor:
    """One int64 stream: each document's tokens followed by the end-of-document token."""
    eos = [] if tok.eos_id is None else [tok.eos_id]
    ids: list[int] = []
    for doc_ids in tok.encode_batch(docs):
        ids.extend(doc_ids)
        ids.extend(eos)
    return torch.tensor(ids, dtype=torch.int64)


def tokenizer_identity(cfg: DataConfig) -> str | list[object]:
    if cfg.tokenizer == "byte":
        return "byte"
    if cfg.tokenizer == "train":
        return ["train", cfg.tokenizer_vocab_size]
    local = Path(cfg.tokenizer)
    if local.is_dir():
        return [os.path.abspath(local), file_fingerprints(sorted(map(str, local.iterdir())))]
    return cfg.tokenizer  # a hub name: assume a given name keeps its tokenizer


def content_hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]
