"""`python -m app.export <run dir | checkpoints/ | step_*.pt> [--out DIR]`: a checkpoint's model
and tokenizer in Hugging Face format (app/engine/export.py writes it).

The model is rebuilt from the config the checkpoint records, and paired with the tokenizer the
run trained with. --out is refused in one line before any work when it would replace anything
but an earlier export.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from app.components.data.config import DataConfig
from app.components.models.config import ModelConfig
from app.components.tasks.config import TaskConfig
from app.core.errors import fail, first_line
from app.engine.export import (
    EXPORT_DIR,
    EXPORT_FILES,
    EXPORT_MARKER,
    SHARD_NAME,
    TOKENIZER_DIR,
    saved_fingerprint,
    write_export,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from app.components.data.task_data import TaskData
    from app.components.tasks.base import Task
    from app.engine.saving.checkpoint import TrainState


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
    settings = run_settings(checkpoint, state)
    model, tokenizer = rebuild(settings, checkpoint, state)
    try:
        write_export(model, tokenizer, target, settings.model)
    except OSError as exc:
        raise ExportError(f"cannot write {target} ({exc.strerror or first_line(exc)})") from None
    return target, checkpoint, int(state.step)


def find_checkpoint(source: Path) -> Path:
    from app.engine.saving import checkpoint as ckpt
    from app.engine.saving.sharded import is_sharded

    if source.is_file() or is_sharded(source):
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
        e.is_file() and not e.is_symlink() and (e.name in known or SHARD_NAME.match(e.name))
        for e in entries
    )
    marked = ours or EXPORT_MARKER in names
    return "config.json" in names and has_weights and only_export_files and marked


def load_state(path: Path) -> TrainState:
    import torch

    from app.core.errors import ConfigError
    from app.engine.saving.checkpoint import TrainState, load_checkpoint
    from app.engine.saving.sharded import is_sharded

    if is_sharded(path):  # its shards load into the model once it is rebuilt
        try:
            return load_checkpoint(path)
        except ConfigError as exc:
            raise ExportError(str(exc).removeprefix("training.resume: ")) from None
    try:  # weights_only: a checkpoint is data, never code to run
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ExportError(
            f"{path} is not a readable checkpoint (a step_*.pt this trainer writes under "
            f"<run dir>/checkpoints; {type(exc).__name__})"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ExportError(f"{path} holds no model state; it was not written by this trainer")
    return TrainState.from_dict(state)


@dataclasses.dataclass
class RunSettings:
    """What rebuilding a checkpoint's model needs of the config it was trained with."""

    task: TaskConfig
    model: ModelConfig
    data: DataConfig


def run_settings(checkpoint: Path, state: TrainState) -> RunSettings:
    """The task, model and data settings the checkpoint was trained with (stored in it, else
    its run's .hydra/), on the schema: keys added since then take their defaults."""
    from omegaconf import OmegaConf

    import app.config.schema  # noqa: F401 (its resolvers: a .hydra/ config may hold them)
    from app.config.recorded import saved_run_config

    saved = saved_run_config(checkpoint, state.config)
    if saved is None:
        raise ExportError(
            f"{checkpoint} records no config and its run directory has no .hydra/config.yaml: "
            "the model it holds cannot be rebuilt"
        )
    schema = OmegaConf.structured(RunSettings(TaskConfig(), ModelConfig(), DataConfig()))
    known = {group: _known(saved.get(group), group) for group in ("task", "model", "data")}
    try:
        settings = OmegaConf.to_object(OmegaConf.merge(schema, known))
    except Exception as exc:  # a value of another type than the schema's today
        raise ExportError(
            f"{checkpoint}: its recorded config does not fit ({first_line(exc)})"
        ) from None
    assert isinstance(settings, RunSettings)
    settings.model.gradient_checkpointing = False  # a training setting: nothing to export
    return settings


def _known(recorded: object, group: str) -> dict[str, object]:
    """The recorded settings of `group` that the schema still has (none where it records no
    mapping for the group)."""
    if not isinstance(recorded, dict):
        return {}
    return {str(k): v for k, v in recorded.items() if k in _names(group)}


def _names(group: str) -> set[str]:
    """The settings a group of the schema has today."""
    kind = {"task": TaskConfig, "model": ModelConfig, "data": DataConfig}[group]
    return {f.name for f in dataclasses.fields(kind)}


def rebuild(
    settings: RunSettings, checkpoint: Path, state: TrainState
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase | None]:
    """The checkpoint's model, and the tokenizer it was trained with: its run's saved one when
    the checkpoint's fingerprint matches it, else rebuilt from the data and checked."""
    from app.components.tasks import build_task

    task = build_task(settings.task)
    recorded = state.tokenizer_sha256
    saved = run_tokenizer(checkpoint, recorded)
    data = model_data(task, settings.data, checkpoint, saved)
    tokenizer = data.info.get("tokenizer")
    if saved is None:
        check_rebuilt(tokenizer, recorded, checkpoint)
    model = task.build_model(settings.model, data)
    try:
        if state.shards is not None:
            from app.engine.saving.sharded import load_weights

            load_weights(model, Path(state.shards))
        else:
            model.load_state_dict(state.model)
    except (RuntimeError, KeyError) as exc:
        raise ExportError(
            f"{checkpoint}: its weights do not fit the model its config describes "
            f"({first_line(exc)})"
        ) from None
    return model, tokenizer


def run_dir_of(checkpoint: Path) -> Path:
    parent = checkpoint.parent
    return parent.parent if parent.name == "checkpoints" else parent


def run_tokenizer(checkpoint: Path, recorded: object) -> PreTrainedTokenizerBase | None:
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


def model_data(
    task: Task, data: DataConfig, checkpoint: Path, saved: PreTrainedTokenizerBase | None
) -> TaskData:
    from app.core.errors import ConfigError

    try:
        return task.model_data(data, saved)
    except ConfigError as exc:
        if saved is not None:
            raise
        raise ExportError(
            f"{checkpoint}: the export rebuilds the tokenizer from the training data because "
            f"the run directory holds no saved tokenizer of this checkpoint, and needs it: {exc}"
        ) from None


def check_rebuilt(
    tokenizer: PreTrainedTokenizerBase | None, recorded: object, checkpoint: Path
) -> None:
    """A tokenizer rebuilt from today's data must be the one the checkpoint was trained with
    (checkpoints from before the fingerprint cannot tell: they are trusted, as they were)."""
    from app.components.data.lm.hf_tokenizer import fingerprint

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
    from app.engine.saving import checkpoint as ckpt

    parent, run_dir = checkpoint.parent, run_dir_of(checkpoint)
    latest = ckpt.list_checkpoints(parent)
    if latest and latest[-1].resolve() == checkpoint.resolve():
        return run_dir / EXPORT_DIR
    return run_dir / f"{EXPORT_DIR}-{checkpoint.stem}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every error of this project
        fail(message)


def main(argv: list[str] | None = None) -> None:
    from app.core.errors import ConfigError

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
        fail(str(exc))
    print(f"exported   {out} (step {step} of {checkpoint})", flush=True)


if __name__ == "__main__":
    main()
