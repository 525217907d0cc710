"""Token data of a causal LM: documents -> tokens -> packed blocks, cached.

Documents (app/components/data/lm/documents.py, or rows: lm/rows.py) are tokenized
(tokenizers.py) into one stream per split and packed into blocks of `seq_len + 1` tokens
(input = block[:-1], target = block[1:]). The per-step loader is in loader.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from app.components.data.lm.documents import read_documents, split_documents, text_identity
from app.components.data.lm.tokenizers import (
    BPE_EOS,
    TokenStreams,
    bpe_path,
    bpe_tokenizer,
    content_hash,
    load_hf_tokenizer,
    load_tokenizer,
    pretrained_tokenizer,
    tokenize_documents,
    tokenizer_identity,
)
from app.components.data.rows import expand_paths
from app.core.atomic import atomic_write
from app.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from app.components.data.config import DataConfig

# Bump when tokenization or packing changes, so old caches are not reused.
CACHE_VERSION = 1


@dataclass
class TokenData:
    train: torch.Tensor  # int64 [n_train_blocks, seq_len + 1]
    val: torch.Tensor  # int64 [n_val_blocks, seq_len + 1]
    vocab_size: int
    pad_id: int | None
    tokenizer_name: str


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


def _build_token_data(cfg: DataConfig, files: list[str]) -> TokenData:
    if cfg.source == "datasets":
        from app.components.data.lm.rows import row_token_streams

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
    docs = read_documents(cfg, files)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction, cfg.seed, cfg.seq_len)
    tok = load_tokenizer(cfg, train_docs, files)
    return TokenStreams(
        train=tokenize_documents(train_docs, tok),
        val=tokenize_documents(val_docs, tok),
        tokenizer=tok,
    )


def transformers_tokenizer(cfg: DataConfig) -> PreTrainedTokenizerBase | None:
    """This data's tokenizer as a transformers tokenizer (what an export saves); None for
    synthetic ids of a BPE that has no text to be trained on."""
    from app.components.data.lm.hf_tokenizer import byte_tokenizer, causal_lm_tokenizer

    if cfg.tokenizer == "byte":
        return byte_tokenizer()
    if cfg.tokenizer != "train":
        return load_hf_tokenizer(cfg.tokenizer)
    if cfg.source == "synthetic":
        return None
    files = expand_paths(list(cfg.paths)) if cfg.source == "text_files" else []
    docs: Iterable[str] | Iterable[list[str]] = []
    if not bpe_path(cfg, files).is_file():  # trained again on the same split: the same BPE
        docs = _bpe_training_text(cfg, files)
    return causal_lm_tokenizer(bpe_tokenizer(cfg, docs, files), BPE_EOS)


def _bpe_training_text(cfg: DataConfig, files: list[str]) -> Iterable[str] | Iterable[list[str]]:
    if cfg.source == "datasets":
        from app.components.data.lm.rows import text_batches, text_splits

        return text_batches(text_splits(cfg)[0], cfg.text_column)
    return split_documents(read_documents(cfg, files), cfg.val_fraction, cfg.seed, cfg.seq_len)[0]


def pack_blocks(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    block = seq_len + 1
    n = ids.numel() // block  # the ragged tail is dropped
    return ids[: n * block].reshape(n, block).clone()


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
    tok = pretrained_tokenizer(cfg.tokenizer)
    return tok.vocab_size, tok.pad_id, tok.name


def _token_cache_key(cfg: DataConfig, files: list[str]) -> str:
    return content_hash(
        {
            "version": CACHE_VERSION,
            "text": text_identity(cfg, files),
            "tokenizer": tokenizer_identity(cfg),
            "seq_len": cfg.seq_len,
        }
    )
