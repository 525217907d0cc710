"""The project's tokenizers as transformers tokenizers: what an export saves beside the model, so
`AutoTokenizer.from_pretrained` gives back exactly the ids the model was trained on."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The byte tokenizer: id = byte value, id 0 the end of a document (byte 0 never occurs in
    text, so it is named `<|endoftext|>`). A byte-level BPE without merges encodes exactly so."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    symbols = _byte_symbols()
    vocab = {symbols[b]: b for b in range(1, 256)}
    vocab[EOS] = 0
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: every byte is its own token whatever the text around it.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS, special=True)])
    return causal_lm_tokenizer(tok, EOS)


def causal_lm_tokenizer(tok: Tokenizer, eos: str) -> PreTrainedTokenizerFast:
    """A tokenizers.Tokenizer as a transformers one whose end-of-document token also pads:
    batched generate() needs a pad token, and a causal LM never attends to padding. Padding
    goes on the left, where generate() wants it for a decoder-only model."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=eos, eos_token=eos, pad_token=eos, padding_side="left"
    )


def fingerprint(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """sha256 of what decides the ids (vocabulary, merges, added tokens, normalizer...): a
    checkpoint records it so an export can tell its run's tokenizer from another. None for a
    slow tokenizer, which has no tokenizer.json to hash."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return None if backend is None else fingerprint_json(backend.to_str())


def fingerprint_json(text: str) -> str:
    """The fingerprint of a tokenizer.json. Padding and truncation are dropped: transformers
    sets them on the tokenizer per call, and they change no id."""
    spec = json.loads(text)
    spec.pop("padding", None)
    spec.pop("truncation", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which tokenizers' ByteLevel uses: printable
    Latin-1 bytes stand for themselves, the rest for the characters from U+0100 on."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(0x100 + extra)
            extra += 1
    return symbols
