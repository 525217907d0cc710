"""The result users load: a model directory in Hugging Face format.

`config.json`, `model.safetensors`, the tokenizer the run trained or loaded, and for a language
model `generation_config.json`: `AutoModelForCausalLM` (or `...ForSequenceClassification`) and
`AutoTokenizer` load it with no code of this project. A completed run writes it to
`<run dir>/model` (`training.export`); `python -m app.export` (app/cli/export.py) writes it from
any checkpoint.

The directory is written beside its target under a temporary name and renamed into place, so an
export is complete or absent, and one it replaces stays whole until the new one is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.atomic import fsync_dir
from app.core.errors import first_line

if TYPE_CHECKING:
    import torch
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

    from app.components.data.config import DataConfig
    from app.components.models.config import ModelConfig
    from app.components.tasks.base import Task

EXPORT_DIR = "model"
# <run dir>/tokenizer: the tokenizer the run trained with, saved when it starts (checkpoints
# record its fingerprint), so an export pairs the weights with it whatever the data is today.
TOKENIZER_DIR = "tokenizer"
# What save_pretrained writes for a model and its tokenizer: a directory holding config.json,
# model.safetensors and nothing but these is an earlier export, which --out may replace.
EXPORT_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        "vocab.json",
        "merges.txt",
        "vocab.txt",
        "tokenizer.model",
        "spiece.model",
        "sentencepiece.bpe.model",
    }
)
SHARD_NAME = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
# Written into every export: what tells an export of ours, which --out may replace, from a model
# directory of the same files that is not (a downloaded base model, say).
EXPORT_MARKER = "hydratrain_export.json"


def write_export(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    out: Path,
    m: ModelConfig,
    weights: Mapping[str, object] | None = None,
) -> Path:
    """Write `model` (unwrapped: no DDP, no torch.compile), built from `m`, and `tokenizer` to
    `out`; `weights`: the whole model's state when `model` holds only a shard of it (FSDP).
    A μP model is written as the standard model it computes (its multipliers folded in)."""
    from app.components.models.families import mup_rules
    from app.components.models.mup.fold import export_record, exported_weights

    hf, rules = transformers_model(model), mup_rules(m)
    state = weights if rules is None else exported_weights(hf, m, rules, weights)
    marker = {"written_by": "hydratrain", "trained_under": export_record(m)}
    return write_dir(Path(out), lambda tmp: save_files(hf, tokenizer, tmp, state, marker))


def transformers_model(model: torch.nn.Module) -> PreTrainedModel:
    """The model as the transformers model every family builds: what has a Hugging Face format."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"{type(model).__name__} is not a transformers model: it cannot be exported"
        )
    return model


def write_dir(out: Path, fill: Callable[[Path], object]) -> Path:
    """`out` as `fill` writes it, complete or absent: filled beside it, then renamed in."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
    tmp.mkdir()  # not mkdtemp: its 0700 would outlive the rename
    try:
        fill(tmp)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save_files(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    directory: Path,
    weights: Mapping[str, object] | None = None,
    marker: Mapping[str, object] | None = None,
) -> None:
    from app.components.models.pretrained_dir import position_limit

    generates = model.can_generate()
    # save_pretrained takes the state to write for a model it cannot gather itself, and drops
    # entries from what it is given: a copy.
    state = dict(weights) if weights is not None else None
    with _quiet(), _use_cache(model, generates):
        model.save_pretrained(directory, safe_serialization=True, state_dict=state)
    if tokenizer is not None:
        limit = position_limit(model.config)
        before = tokenizer.model_max_length  # the run's object: set for the export only
        if limit is not None:  # inputs longer than the positions are refused with a warning
            tokenizer.model_max_length = limit
        try:
            tokenizer.save_pretrained(directory)
        finally:
            tokenizer.model_max_length = before
    if generates:
        generation_config(model, tokenizer).save_pretrained(directory)
    record = {"written_by": "hydratrain"} if marker is None else marker
    (directory / EXPORT_MARKER).write_text(json.dumps(record) + "\n")


def generation_config(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None
) -> GenerationConfig:
    """Stop at the end-of-document token the model was trained with, and pad with it: without
    a pad id generate() warns, and batched generation has nothing to pad with. A fresh config,
    not one derived from the model's, which older transformers would re-derive and drop."""
    from transformers import GenerationConfig

    def token(name: str) -> int | None:
        found = getattr(tokenizer, f"{name}_token_id", None)
        return getattr(model.config, f"{name}_token_id", None) if found is None else found

    eos, pad = token("eos"), token("pad")
    return GenerationConfig(
        bos_token_id=token("bos"), eos_token_id=eos, pad_token_id=eos if pad is None else pad
    )


@contextlib.contextmanager
def _use_cache(model: PreTrainedModel, on: bool) -> Iterator[None]:
    """Training turns the KV cache off (it only costs memory there); generation wants it."""
    before = getattr(model.config, "use_cache", None)
    if on:
        model.config.use_cache = True
    try:
        yield
    finally:
        if on:
            model.config.use_cache = before


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bar in a run's log for writing one shard."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _replace(new: Path, out: Path) -> None:
    # Two renames: the old export moves aside, the new one takes its name. A kill in between
    # leaves no export and both temporaries, which the next export removes.
    old = None
    if out.exists() or out.is_symlink():
        old = out.with_name(f".{out.name}.old-{os.getpid()}.tmp")
        os.replace(out, old)
    os.replace(new, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def remove_stale_temporaries(out: Path) -> None:
    """Temporaries of an export a kill interrupted."""
    for tmp in out.parent.glob(f".{out.name}.*.tmp"):
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def export_run(
    model: torch.nn.Module,
    task: Task,
    data: DataConfig,
    m: ModelConfig,
    run_dir: Path,
    weights: Mapping[str, object] | None = None,
) -> Path:
    """The end of a completed run: <run dir>/model (`weights`: FSDP's gathered state). A failed
    write ends the run in one line."""
    from app.core.outcomes import WriteFailed

    out = run_dir / EXPORT_DIR
    try:
        return write_export(model, task.export_tokenizer(data), out, m, weights)
    except (OSError, RuntimeError) as exc:  # torch/safetensors report a full disk variously
        raise WriteFailed(
            f"could not write the export {out} ({first_line(exc)}); the checkpoints are intact: "
            f"python -m app.export {run_dir} writes it again"
        ) from None


def save_run_tokenizer(tokenizer: PreTrainedTokenizerBase | None, run_dir: Path) -> str | None:
    """Save the run's tokenizer to <run dir>/tokenizer (once: kept while its fingerprint is the
    same, as on a resume) and return the fingerprint its checkpoints record; None when there is
    nothing to save (synthetic ids, a slow tokenizer)."""
    from app.components.data.lm.hf_tokenizer import fingerprint
    from app.core.outcomes import WriteFailed

    if tokenizer is None:
        return None
    found = fingerprint(tokenizer)
    directory = run_dir / TOKENIZER_DIR
    if found is None or saved_fingerprint(directory) == found:
        return found
    try:
        write_dir(directory, lambda tmp: tokenizer.save_pretrained(tmp))
    except OSError as exc:
        raise WriteFailed(
            f"could not write the run's tokenizer {directory} ({first_line(exc)})"
        ) from None
    return found


def saved_fingerprint(directory: Path) -> str | None:
    """The fingerprint of the tokenizer saved in `directory`, None when there is none."""
    from app.components.data.lm.hf_tokenizer import fingerprint_json

    try:
        return fingerprint_json((directory / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):  # absent, unreadable, not a JSON object
        return None
