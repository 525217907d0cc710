"""What a local pretrained checkpoint says about itself, read cheaply (config.json and the
tokenizer files, no weights), so a run can be checked against it before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.config.validation import ConfigError, first_line

# Files of which any one makes a directory a tokenizer AutoTokenizer can load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def local_dir(name: str | None) -> Path | None:
    """The directory a model.path or data.tokenizer names, or None for a hub name."""
    if not name:
        return None
    path = Path(str(name)).expanduser()
    return path if path.is_dir() else None


def has_tokenizer(directory: Path) -> bool:
    return any((directory / f).is_file() for f in TOKENIZER_FILES)


def model_config(directory: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.path={directory}: no readable config.json ({first_line(exc)})"
        ) from None


def tokenizer_size(directory: Path) -> int:
    from transformers import AutoTokenizer

    try:
        return len(AutoTokenizer.from_pretrained(directory))
    except Exception as exc:  # hub/IO/parse errors all mean the same thing to the user
        raise ConfigError(
            f"data.tokenizer={directory} could not be loaded ({first_line(exc)}); use byte, train "
            "or a directory holding a tokenizer"
        ) from None


def position_limit(config: Any) -> int | None:
    """The longest sequence the checkpoint's position embeddings cover (None: no limit, as for
    DeBERTa-v3's relative positions). RoBERTa's positions start after its padding index."""
    if getattr(config, "position_biased_input", True) is False:
        return None
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is None:
        return None
    if "roberta" in config.model_type and config.pad_token_id is not None:
        limit -= config.pad_token_id + 1
    return int(limit)
