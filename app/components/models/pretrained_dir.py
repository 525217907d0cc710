"""What a local pretrained checkpoint says about itself, read cheaply (config.json and the
tokenizer files, no weights), so a run can be checked against it before any work."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors import ConfigError, first_line

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from app.components.data.config import DataConfig
    from app.components.models.config import ModelConfig
    from app.components.models.task import Task

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


def model_config(directory: Path) -> PretrainedConfig:
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


def position_limit(config: PretrainedConfig) -> int | None:
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


# ---------------------------------------------------------------------------------------------
# Checks of a local checkpoint against the run, before any work


def looks_local(name: str) -> bool:
    """A path rather than a hub name ("gpt2", "org/model"): absolute, ~ or ./ ../."""
    return name.startswith(("/", "~", "./", "../")) or name in (".", "..")


def check_checkpoint(m: ModelConfig, data: DataConfig, task: Task) -> None:
    """model.path as a local directory: there; its positions cover the sequence length and its
    embeddings every id the tokenizer makes (a hub name is checked when it loads: whether it
    can be fetched depends on the network)."""
    path = m.path
    if path and looks_local(str(path)) and not Path(str(path)).expanduser().exists():
        raise ConfigError(f"model.path={path}: no such file or directory")
    model_dir = local_dir(path)
    if model_dir is None:
        return
    config = model_config(model_dir)
    check_positions(m, data, task, config)
    if _same_dir(data.tokenizer, model_dir):
        check_own_tokenizer(data, model_dir)
    vocab = tokenizer_vocab(data, task)
    if vocab is not None and vocab > config.vocab_size:
        raise ConfigError(
            f"data.tokenizer={data.tokenizer} makes {vocab} token ids but model.path="
            f"{path} has embeddings for {config.vocab_size}; use the model's own "
            f"tokenizer (data.tokenizer={path})"
        )


def check_positions(m: ModelConfig, data: DataConfig, task: Task, config: PretrainedConfig) -> None:
    key, length = task.sequence_setting, task.sequence_length(data)
    limit = position_limit(config)
    if limit is not None and length > limit:
        raise ConfigError(
            f"data.{key}={length} exceeds the {limit} positions of model.path="
            f"{m.path} (its max_position_embeddings); use data.{key}<={limit}"
        )


def check_own_tokenizer(data: DataConfig, model_dir: Path) -> None:
    if not has_tokenizer(model_dir):
        raise ConfigError(
            f"data.tokenizer={data.tokenizer} (the model's own, the default for "
            f"model=pretrained): model.path has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
            "set data.tokenizer to the tokenizer it was trained with, or byte or train"
        )


def tokenizer_vocab(data: DataConfig, task: Task) -> int | None:
    """How many ids the tokenizer makes, where that is cheap to know (None: a hub name)."""
    name = data.tokenizer
    if name == "byte":  # a task may add special tokens to the bytes (Task.byte_vocab)
        return task.byte_vocab
    if name == "train":
        return data.tokenizer_vocab_size
    directory = local_dir(name)
    return None if directory is None else tokenizer_size(directory)


def tokenizer_warning(m: ModelConfig, data: DataConfig) -> str | None:
    """A tokenizer other than the checkpoint's own: allowed (set on purpose, since the default
    is the model's own), but the ids no longer mean what the model learned."""
    model_dir = local_dir(m.path)
    if model_dir is None or not has_tokenizer(model_dir):
        return None
    if _same_dir(data.tokenizer, model_dir):
        return None
    return (
        f"data.tokenizer={data.tokenizer} is not the tokenizer of model.path="
        f"{m.path}: its ids mean other text than the model learned"
    )


def _same_dir(name: str | None, directory: Path) -> bool:
    other = local_dir(name)
    return other is not None and other.resolve() == directory.resolve()
