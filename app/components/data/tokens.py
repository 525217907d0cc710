"""Token data: documents -> tokens -> packed blocks, cached.

Documents are the generated corpus (`data.source=builtin`), the paragraphs of text files
(`text_files`; a file of one paragraph is cut in two: its tail is the validation text), or the
text column of rows read through `datasets` (`datasets`: app/data/lm_rows.py).

Blocks are `seq_len + 1` tokens (input = block[:-1], target = block[1:]). Documents are joined
with an end-of-document token: byte 0 for the byte tokenizer (it never occurs in text, unlike a
newline, so a document boundary is unambiguous), `<|endoftext|>` for a trained BPE, and the
tokenizer's EOS (else SEP) for a pretrained one. The per-step loader is in app/data/loader.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from app.components.data.config import DataConfig
from app.components.data.corpus import CORPUS_VERSION, generate_corpus
from app.components.data.rows import dataset_identity, expand_paths, file_fingerprints
from app.core.atomic import atomic_write, atomic_write_text
from app.core.errors import ConfigError, first_line

# Bump when tokenization or packing changes, so old caches are not reused.
CACHE_VERSION = 1
BYTE_EOS = 0
BPE_EOS = "<|endoftext|>"


@dataclass
class TokenData:
    train: torch.Tensor  # int64 [n_train_blocks, seq_len + 1]
    val: torch.Tensor  # int64 [n_val_blocks, seq_len + 1]
    vocab_size: int
    pad_id: int | None
    tokenizer_name: str


@dataclass
class TextTokenizer:
    name: str
    vocab_size: int
    eos_id: int | None  # appended after every document; None: documents are just concatenated
    pad_id: int | None
    encode_batch: Callable[[list[str]], list[list[int]]]
    decode: Callable[[list[int]], str]


# ---------------------------------------------------------------------------------------------
# Public entry point


def load_token_data(cfg: DataConfig) -> TokenData:
    if cfg.source == "synthetic":
        return _synthetic_data(cfg)
    files = expand_paths(list(cfg.paths)) if cfg.source == "text_files" else []
    cache_path = Path(cfg.cache_dir) / f"tokens-{_token_cache_key(cfg, files)}.pt"
    if cache_path.is_file():
        return TokenData(**torch.load(cache_path, weights_only=True))
    data = _build_token_data(cfg, files)
    atomic_write(cache_path, lambda f: torch.save(vars(data), f))
    return data


@dataclass
class TokenStreams:
    """Both splits as one token stream each, and the tokenizer that made them."""

    train: torch.Tensor  # int64 [n_train_tokens]
    val: torch.Tensor  # int64 [n_val_tokens]
    tokenizer: TextTokenizer


def _build_token_data(cfg: DataConfig, files: list[str]) -> TokenData:
    if cfg.source == "datasets":
        from app.components.data.lm_rows import row_token_streams

        streams = row_token_streams(cfg)
    else:
        streams = _document_token_streams(cfg, files)
    block = cfg.seq_len + 1
    n_train, n_val = streams.train.numel(), streams.val.numel()
    if n_train < block or n_val < block:
        raise ConfigError(
            f"data.seq_len={cfg.seq_len}: the corpus ({n_train} train / {n_val} val tokens) is "
            f"too small for one train and one val block of {block} tokens; lower data.seq_len "
            "or add text via data.paths"
        )
    return TokenData(
        train=pack_blocks(streams.train, cfg.seq_len),
        val=pack_blocks(streams.val, cfg.seq_len),
        vocab_size=streams.tokenizer.vocab_size,
        pad_id=streams.tokenizer.pad_id,
        tokenizer_name=streams.tokenizer.name,
    )


def _document_token_streams(cfg: DataConfig, files: list[str]) -> TokenStreams:
    docs = _read_documents(cfg, files)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction, cfg.seed, cfg.seq_len)
    tok = load_tokenizer(cfg, train_docs, files)
    return TokenStreams(
        train=tokenize_documents(train_docs, tok),
        val=tokenize_documents(val_docs, tok),
        tokenizer=tok,
    )


# ---------------------------------------------------------------------------------------------
# Documents


def _read_documents(cfg: DataConfig, files: list[str]) -> list[str]:
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


# ---------------------------------------------------------------------------------------------
# Tokenizers


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
    return _pretrained_tokenizer(cfg.tokenizer)


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
) -> Any:
    """The BPE trained on this data's train split: from the cache, else trained and cached."""
    from tokenizers import Tokenizer

    path = _bpe_path(cfg, files)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = _train_bpe(train_docs, cfg.tokenizer_vocab_size)
    atomic_write_text(path, tok.to_str())
    return tok


def _train_bpe(texts: Iterable[str] | Iterable[list[str]], vocab_size: int) -> Any:
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


def _bpe_path(cfg: DataConfig, files: list[str]) -> Path:
    return Path(cfg.cache_dir) / f"bpe-{_bpe_cache_key(cfg, files)}.json"


def transformers_tokenizer(cfg: DataConfig) -> Any | None:
    """This data's tokenizer as a transformers tokenizer (what an export saves); None for
    synthetic ids of a BPE that has no text to be trained on."""
    from app.components.data.hf_tokenizer import byte_tokenizer, causal_lm_tokenizer

    if cfg.tokenizer == "byte":
        return byte_tokenizer()
    if cfg.tokenizer != "train":
        return load_hf_tokenizer(cfg.tokenizer)
    if cfg.source == "synthetic":
        return None
    files = expand_paths(list(cfg.paths)) if cfg.source == "text_files" else []
    docs: Iterable[str] | Iterable[list[str]] = []
    if not _bpe_path(cfg, files).is_file():  # trained again on the same split: the same BPE
        docs = _bpe_training_text(cfg, files)
    return causal_lm_tokenizer(bpe_tokenizer(cfg, docs, files), BPE_EOS)


def _bpe_training_text(cfg: DataConfig, files: list[str]) -> Iterable[str] | Iterable[list[str]]:
    if cfg.source == "datasets":
        from app.components.data.lm_rows import text_batches, text_splits

        return text_batches(text_splits(cfg)[0], cfg.text_column)
    return split_documents(_read_documents(cfg, files), cfg.val_fraction, cfg.seed, cfg.seq_len)[0]


def load_hf_tokenizer(name: str) -> Any:
    """A transformers tokenizer by local path or hub name; one line naming data.tokenizer."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # hub/IO/parse errors all mean the same thing to the user
        raise ConfigError(
            f"data.tokenizer={name!r} could not be loaded ({first_line(e)}); use byte, train, "
            "a local tokenizer directory or a hub name available offline"
        ) from e


def _pretrained_tokenizer(name: str) -> TextTokenizer:
    tok = load_hf_tokenizer(name)
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id

    def encode_batch(texts: list[str]) -> list[list[int]]:
        # verbose=False: documents longer than model_max_length are fine, we pack them.
        return tok(texts, add_special_tokens=False, verbose=False)["input_ids"]

    return TextTokenizer(
        name=name,
        vocab_size=len(tok),
        eos_id=eos,
        pad_id=tok.pad_token_id,
        encode_batch=encode_batch,
        decode=lambda ids: tok.decode(ids),
    )


def tokenize_documents(docs: list[str], tok: TextTokenizer) -> torch.Tensor:
    """One int64 stream: each document's tokens followed by the end-of-document token."""
    eos = [] if tok.eos_id is None else [tok.eos_id]
    ids: list[int] = []
    for doc_ids in tok.encode_batch(docs):
        ids.extend(doc_ids)
        ids.extend(eos)
    return torch.tensor(ids, dtype=torch.int64)


def pack_blocks(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    block = seq_len + 1
    n = ids.numel() // block  # the ragged tail is dropped
    return ids[: n * block].reshape(n, block).clone()


# ---------------------------------------------------------------------------------------------
# Synthetic data: uniform random tokens, nothing to learn


def _synthetic_data(cfg: DataConfig) -> TokenData:
    vocab, pad_id, name = _synthetic_vocab(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(vocab, (cfg.synthetic_num_tokens,), generator=gen, dtype=torch.int64)
    blocks = pack_blocks(ids, cfg.seq_len)
    if len(blocks) < 2:
        raise ConfigError(
            f"data.synthetic_num_tokens={cfg.synthetic_num_tokens} is too few for two blocks of "
            f"data.seq_len+1={cfg.seq_len + 1} tokens"
        )
    n_val = min(len(blocks) - 1, max(1, round(cfg.val_fraction * len(blocks))))
    return TokenData(
        train=blocks[n_val:],
        val=blocks[:n_val],
        vocab_size=vocab,
        pad_id=pad_id,
        tokenizer_name=name,
    )


def _synthetic_vocab(cfg: DataConfig) -> tuple[int, int | None, str]:
    if cfg.tokenizer == "byte":
        return 256, None, "byte"
    if cfg.tokenizer == "train":
        # No text to train on: the configured size is the vocabulary.
        return cfg.tokenizer_vocab_size, None, f"trained-bpe:{cfg.tokenizer_vocab_size}"
    tok = _pretrained_tokenizer(cfg.tokenizer)
    return tok.vocab_size, tok.pad_id, tok.name


# ---------------------------------------------------------------------------------------------
# Caching


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def _text_identity(cfg: DataConfig, files: list[str]) -> dict[str, Any]:
    """What determines the documents and their train/val split."""
    ident: dict[str, Any] = {
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


def _bpe_cache_key(cfg: DataConfig, files: list[str]) -> str:
    # Trained on the train split only, so the split settings are part of the key.
    return _hash({"text": _text_identity(cfg, files), "vocab": cfg.tokenizer_vocab_size})


def _tokenizer_identity(cfg: DataConfig) -> Any:
    if cfg.tokenizer == "byte":
        return "byte"
    if cfg.tokenizer == "train":
        return ["train", cfg.tokenizer_vocab_size]
    local = Path(cfg.tokenizer)
    if local.is_dir():
        return [os.path.abspath(local), file_fingerprints(sorted(map(str, local.iterdir())))]
    return cfg.tokenizer  # a hub name: assume a given name keeps its tokenizer


def _token_cache_key(cfg: DataConfig, files: list[str]) -> str:
    return _hash(
        {
            "version": CACHE_VERSION,
            "text": _text_identity(cfg, files),
            "tokenizer": _tokenizer_identity(cfg),
            "seq_len": cfg.seq_len,
        }
    )
