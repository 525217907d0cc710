"""The result users load: a model directory in Hugging Face format.

`config.json`, `model.safetensors`, the tokenizer the run trained or loaded, and for a language
model `generation_config.json`: `AutoModelForCausalLM` (or `...ForSequenceClassification`) and
`AutoTokenizer` load it with no code of this project. A completed run writes it to
`<run dir>/model` (`training.export`); `python -m app.export` writes it from any checkpoint.

The directory is written beside its target under a temporary name and renamed into place, so an
export is complete or absent, and one it replaces stays whole until the new one is there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from app.core.atomic import fsync_dir
from app.config.validation import first_line

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
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
# Written into every export: what tells an export of ours, which --out may replace, from a model
# directory of the same files that is not (a downloaded base model, say).
EXPORT_MARKER = "hydratrain_export.json"


def write_export(model: Any, tokenizer: Any | None, out: Path) -> Path:
    """Write `model` (unwrapped: no DDP, no torch.compile) and `tokenizer` to `out`."""
    return write_dir(Path(out), lambda tmp: save_files(model, tokenizer, tmp))


def write_dir(out: Path, fill: Callable[[Path], None]) -> Path:
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


def save_files(model: Any, tokenizer: Any | None, directory: Path) -> None:
    from app.components.models.pretrained import position_limit

    generates = model.can_generate()
    with _quiet(), _use_cache(model, generates):
        model.save_pretrained(directory, safe_serialization=True)
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
    (directory / EXPORT_MARKER).write_text('{"written_by": "hydratrain"}\n')


def generation_config(model: Any, tokenizer: Any | None) -> Any:
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
def _use_cache(model: Any, on: bool) -> Iterator[None]:
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


def export_run(model: Any, task: Any, data_cfg: Any, run_dir: Path) -> Path:
    """The end of a completed run: <run dir>/model. A failed write ends the run in one line."""
    from app.core.outcomes import WriteFailed

    out = run_dir / EXPORT_DIR
    try:
        return write_export(model, task.export_tokenizer(data_cfg), out)
    except (OSError, RuntimeError) as exc:  # torch/safetensors report a full disk variously
        raise WriteFailed(
            f"could not write the export {out} ({first_line(exc)}); the checkpoints are intact: "
            f"python -m app.export {run_dir} writes it again"
        ) from None


def save_run_tokenizer(tokenizer: Any | None, run_dir: Path) -> str | None:
    """Save the run's tokenizer to <run dir>/tokenizer (once: kept while its fingerprint is the
    same, as on a resume) and return the fingerprint its checkpoints record; None when there is
    nothing to save (synthetic ids, a slow tokenizer)."""
    from app.components.data.hf_tokenizer import fingerprint
    from app.core.outcomes import WriteFailed

    found = None if tokenizer is None else fingerprint(tokenizer)
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
    from app.components.data.hf_tokenizer import fingerprint_json

    try:
        return fingerprint_json((directory / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):  # absent, unreadable, not a JSON object
        return None


# ---------------------------------------------------------------------------------------------
# From a checkpoint: python -m app.export <run dir | checkpoints/ | step_*.pt> [--out DIR]


class ExportError(Exception):
    """A bad argument or a checkpoint that cannot be exported: one line, exit status 2."""


def export_checkpoint(source: Path, out: Path | None = None) -> tuple[Path, Path, int]:
    """Rebuild the model a checkpoint holds from the config it records and export it;
    returns (the export, the checkpoint, its step)."""
    checkpoint = find_checkpoint(source)
    default = default_out(checkpoint)
    target = out or default
    check_out(target, checkpoint, "--out" if out else "the default --out", ours=target == default)
    state = load_state(checkpoint)
    cfg = run_config(checkpoint, state)
    model, tokenizer = rebuild(cfg, checkpoint, state)
    try:
        write_export(model, tokenizer, target)
    except OSError as exc:
        raise ExportError(f"cannot write {target} ({exc.strerror or first_line(exc)})") from None
    return target, checkpoint, int(state.get("step", 0))


def find_checkpoint(source: Path) -> Path:
    from app.engine import checkpoint as ckpt

    if source.is_file():
        return source
    for directory in (source / "checkpoints", source):
        found = ckpt.list_checkpoints(directory)
        if found:
            return found[-1]
    if not source.exists():
        raise ExportError(f"{source}: no such file or directory")
    raise ExportError(
        f"{source}: no checkpoint there; give a run directory, its checkpoints/ directory or "
        "a step_*.pt file"
    )


def check_out(out: Path, checkpoint: Path, name: str, ours: bool) -> None:
    """Refuse, before any work, an export directory whose replacement would destroy what is
    not an export: the run, its checkpoints, a file, a directory of other things. `ours`: out
    is the run's own default export directory (the export's default)."""
    label = f"{name} {out}"
    existing = next((p for p in out.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ExportError(f"{label}: {existing} is not a directory")
    if out.is_symlink():
        raise ExportError(f"{label} is a symbolic link; give the directory itself")
    run_dir, where = run_dir_of(checkpoint), out.resolve()
    if where == run_dir.resolve():
        raise ExportError(
            f"{label} is the run directory; give a new directory, e.g. {out / EXPORT_DIR}"
        )
    if checkpoint.resolve().is_relative_to(where):  # out is it, its directory or above
        raise ExportError(
            f"{label} is or holds the checkpoint {checkpoint}; give another directory"
        )
    if checkpoint.parent != run_dir and where.is_relative_to(checkpoint.parent.resolve()):
        raise ExportError(f"{label} is inside the checkpoints directory; give another directory")
    if out.exists() and not out.is_dir():
        raise ExportError(
            f"{label} is a file; give a new directory, an empty one or an earlier export"
        )
    if out.is_dir() and not is_earlier_export(out, ours=ours):
        raise ExportError(
            f"{label} is a directory that is not an earlier export of this trainer (it holds "
            f"{EXPORT_MARKER}, config.json, model.safetensors and the model's and tokenizer's "
            "files only); give a new directory, an empty one or an earlier export"
        )


def is_earlier_export(directory: Path, ours: bool = False) -> bool:
    """Empty (nothing to lose), or config.json and model.safetensors (or its shards' index)
    and nothing but files save_pretrained writes (no subdirectory, no other name), with our
    marker; `ours` (the run's own default export directory) lets an export written before the
    marker existed be replaced too."""
    entries = list(directory.iterdir())
    names = {e.name for e in entries}
    if not names:
        return True
    has_weights = bool(names & {"model.safetensors", "model.safetensors.index.json"})
    known = EXPORT_FILES | {EXPORT_MARKER}
    only_export_files = all(
        e.is_file() and not e.is_symlink() and (e.name in known or _SHARD.match(e.name))
        for e in entries
    )
    marked = ours or EXPORT_MARKER in names
    return "config.json" in names and has_weights and only_export_files and marked


def load_state(path: Path) -> dict[str, Any]:
    import torch

    try:  # weights_only: a checkpoint is data, never code to run
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ExportError(
            f"{path} is not a readable checkpoint (a step_*.pt this trainer writes under "
            f"<run dir>/checkpoints; {type(exc).__name__})"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ExportError(f"{path} holds no model state; it was not written by this trainer")
    return state


def run_config(checkpoint: Path, state: dict[str, Any]) -> Any:
    """The task, model and data settings the checkpoint was trained with (stored in it, else
    its run's .hydra/), on the schema: keys added since then take their defaults."""
    from omegaconf import OmegaConf

    from app.engine.start_checks import saved_run_config
    from app.config.schema import DataConfig, ModelConfig, TaskConfig

    saved = saved_run_config(checkpoint, state)
    if saved is None:
        raise ExportError(
            f"{checkpoint} records no config and its run directory has no .hydra/config.yaml: "
            "the model it holds cannot be rebuilt"
        )
    schema = OmegaConf.create({"task": TaskConfig(), "model": ModelConfig(), "data": DataConfig()})
    known = {
        group: {k: v for k, v in (saved.get(group) or {}).items() if k in schema[group]}
        for group in schema
    }
    try:
        cfg = OmegaConf.merge(schema, known)
    except Exception as exc:  # a value of another type than the schema's today
        raise ExportError(
            f"{checkpoint}: its recorded config does not fit ({first_line(exc)})"
        ) from None
    cfg.model.gradient_checkpointing = False  # a training setting: nothing to export
    return cfg


def rebuild(cfg: Any, checkpoint: Path, state: dict[str, Any]) -> tuple[Any, Any | None]:
    """The checkpoint's model, and the tokenizer it was trained with: its run's saved one when
    the checkpoint's fingerprint matches it, else rebuilt from the data and checked."""
    from app.components.tasks import build_task

    task = build_task(cfg.task)
    recorded = state.get("tokenizer_sha256")
    saved = run_tokenizer(checkpoint, recorded)
    data = model_data(task, cfg.data, checkpoint, saved)
    tokenizer = data.info.get("tokenizer")
    if saved is None:
        check_rebuilt(tokenizer, recorded, checkpoint)
    model = task.build_model(cfg.model, data)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as exc:
        raise ExportError(
            f"{checkpoint}: its weights do not fit the model its config describes "
            f"({first_line(exc)})"
        ) from None
    return model, tokenizer


def run_dir_of(checkpoint: Path) -> Path:
    parent = checkpoint.parent
    return parent.parent if parent.name == "checkpoints" else parent


def run_tokenizer(checkpoint: Path, recorded: Any) -> Any | None:
    """The run's saved tokenizer if it is the one the checkpoint records, else None."""
    from transformers import AutoTokenizer

    directory = run_dir_of(checkpoint) / TOKENIZER_DIR
    if not isinstance(recorded, str) or saved_fingerprint(directory) != recorded:
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except Exception as exc:  # its other files damaged: IO and parse errors alike
        raise ExportError(
            f"{directory}: the run's tokenizer cannot be loaded ({first_line(exc)})"
        ) from None
    # How it was loaded, not what it is: transformers would write these into the export's
    # tokenizer_config.json, which the end-of-run export (from memory) does not have.
    for key in ("is_local", "local_files_only"):
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def model_data(task: Any, data_cfg: Any, checkpoint: Path, saved: Any | None) -> Any:
    from app.config.validation import ConfigError

    try:
        return task.model_data(data_cfg, saved)
    except ConfigError as exc:
        if saved is not None:
            raise
        raise ExportError(
            f"{checkpoint}: the export rebuilds the tokenizer from the training data because "
            f"the run directory holds no saved tokenizer of this checkpoint, and needs it: {exc}"
        ) from None


def check_rebuilt(tokenizer: Any | None, recorded: Any, checkpoint: Path) -> None:
    """A tokenizer rebuilt from today's data must be the one the checkpoint was trained with
    (checkpoints from before the fingerprint cannot tell: they are trusted, as they were)."""
    from app.components.data.hf_tokenizer import fingerprint

    if not isinstance(recorded, str) or tokenizer is None:
        return
    if fingerprint(tokenizer) != recorded:
        saved = run_dir_of(checkpoint) / TOKENIZER_DIR
        raise ExportError(
            f"{checkpoint}: the tokenizer rebuilt from the training data today is not the one "
            f"the run trained with (sha256 {recorded[:12]}), and {saved} does not hold it; "
            "restore that directory or the training data as it was"
        )


def default_out(checkpoint: Path) -> Path:
    """<run dir>/model for the run's latest checkpoint; an earlier one gets model-step_N, so
    it never replaces the export of the finished run."""
    from app.engine import checkpoint as ckpt

    parent, run_dir = checkpoint.parent, run_dir_of(checkpoint)
    latest = ckpt.list_checkpoints(parent)
    if latest and latest[-1].resolve() == checkpoint.resolve():
        return run_dir / EXPORT_DIR
    return run_dir / f"{EXPORT_DIR}-{checkpoint.stem}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every error of this project
        _fail(message)


def _fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    from app.config.validation import ConfigError

    parser = _Parser(
        prog="python -m app.export",
        description="Write a checkpoint's model and tokenizer in Hugging Face format.",
    )
    parser.add_argument("source", help="a run directory, its checkpoints/ or a step_*.pt file")
    parser.add_argument(
        "--out",
        help="the export directory (default: <run dir>/model): a new path, an empty directory "
        "or an earlier export, which is replaced (a directory holding config.json, "
        "model.safetensors and nothing but a model's and tokenizer's files: "
        f"{', '.join(sorted(EXPORT_FILES))}, model-NNNNN-of-NNNNN.safetensors, and the "
        f"{EXPORT_MARKER} every export of this trainer has); never the run directory, nor the "
        "checkpoints or anything inside them",
    )
    args = parser.parse_args(argv)
    try:
        out, checkpoint, step = export_checkpoint(
            Path(args.source), Path(args.out) if args.out else None
        )
    except (ExportError, ConfigError) as exc:
        _fail(str(exc))
    print(f"exported   {out} (step {step} of {checkpoint})", flush=True)


if __name__ == "__main__":
    main()
