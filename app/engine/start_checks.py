"""Checks of the machine and the files a run will use, done before anything is written.

`app.config.schema.validate` judges a config on its own; these look outside it: the run directory can be
written, the data files are text, the model and one step's batch fit the memory there is, and a
checkpoint to resume belongs to this model. Each failure is a `ConfigError` naming the setting.
`app.cli.preflight` runs them before Hydra creates the run directory, so a refused run leaves an
existing directory exactly as it was; the runner runs them again for sweep trials.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from app.config.schema import sequence_key
from app.components.hardware.memory import host_memory_bytes
from app.components.models.size import estimate_parameters
from app.components.tracking import check_trackers
from app.config.validation import ConfigError

GIB = 2**30
SNIFF_BYTES = 64 * 1024
# One optimizer step's token ids live on the host (and a few more in the loader's prefetch).
STEP_BATCH_HOST_FRACTION = 0.1
# fp32 weights + gradients + AdamW's two moments.
TRAIN_STATE_BYTES_PER_PARAM = 16
# What a checkpoint must agree on with the run that resumes it.
SHAPE_KEYS = (
    "task.name",
    "model.arch",
    "model.path",
    "model.vocab_size",
    "model.n_layer",
    "model.n_head",
    "model.n_kv_head",
    "model.n_embd",
    "model.intermediate_size",
    "model.max_position_embeddings",
    "data.tokenizer",
    "data.tokenizer_vocab_size",
)
# What a checkpoint written before a key existed was trained with.
SHAPE_DEFAULTS = {"task.name": "causal_lm"}


def check_run_dir(run_dir: Path, setting: str = "hydra.run.dir") -> None:
    """The run directory (or the closest parent that exists) must be writable."""
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{setting}={run_dir}: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only_mount(probe) else "permission denied"
        raise ConfigError(
            f"{setting}={run_dir}: cannot write in {probe} ({why}); choose a writable directory"
        )


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def looks_local(name: str) -> bool:
    """A path rather than a hub name ("gpt2", "org/model"): absolute, ~ or ./ ../."""
    return name.startswith(("/", "~", "./", "../")) or name in (".", "..")


def check_local_paths(cfg: DictConfig) -> None:
    """A model or tokenizer named by a local path must be there (a hub name is checked when
    it loads: whether it can be fetched depends on the network)."""
    named = [("data.tokenizer", cfg.data.tokenizer)]
    if cfg.model.arch == "pretrained":
        named.insert(0, ("model.path", cfg.model.path))
    for key, value in named:
        if value and looks_local(str(value)) and not Path(str(value)).expanduser().exists():
            raise ConfigError(f"{key}={value}: no such file or directory")


def check_vocab(cfg: DictConfig) -> None:
    if (
        cfg.task.name == "causal_lm"
        and cfg.data.tokenizer == "byte"
        and cfg.model.arch != "pretrained"
    ):
        vocab = cfg.model.vocab_size
        if vocab is not None and vocab < 256:
            raise ConfigError(
                f"model.vocab_size={vocab} is smaller than the byte tokenizer's 256 symbols; "
                "use model.vocab_size>=256 or null"
            )


# ---------------------------------------------------------------------------------------------
# A local pretrained checkpoint


def check_pretrained(cfg: DictConfig) -> None:
    """model=pretrained from a local directory: its positions must cover the sequence length
    and its embeddings every id the tokenizer makes (a hub name is checked when it loads)."""
    from app.components.models.pretrained import local_dir, model_config

    model_dir = local_dir(cfg.model.path) if cfg.model.arch == "pretrained" else None
    if model_dir is None:
        return
    config = model_config(model_dir)
    check_positions(cfg, config)
    if _same_dir(cfg.data.tokenizer, model_dir):
        check_own_tokenizer(cfg, model_dir)
    vocab = tokenizer_vocab(cfg)
    if vocab is not None and vocab > config.vocab_size:
        raise ConfigError(
            f"data.tokenizer={cfg.data.tokenizer} makes {vocab} token ids but model.path="
            f"{cfg.model.path} has embeddings for {config.vocab_size}; use the model's own "
            f"tokenizer (data.tokenizer={cfg.model.path})"
        )


def check_positions(cfg: DictConfig, config: Any) -> None:
    from app.components.models.pretrained import position_limit

    key = sequence_key(cfg.task.name)
    limit = position_limit(config)
    if limit is not None and cfg.data[key] > limit:
        raise ConfigError(
            f"data.{key}={cfg.data[key]} exceeds the {limit} positions of model.path="
            f"{cfg.model.path} (its max_position_embeddings); use data.{key}<={limit}"
        )


def check_own_tokenizer(cfg: DictConfig, model_dir: Path) -> None:
    from app.components.models.pretrained import TOKENIZER_FILES, has_tokenizer

    if not has_tokenizer(model_dir):
        raise ConfigError(
            f"data.tokenizer={cfg.data.tokenizer} (the model's own, the default for "
            f"model=pretrained): model.path has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
            "set data.tokenizer to the tokenizer it was trained with, or byte or train"
        )


def tokenizer_vocab(cfg: DictConfig) -> int | None:
    """How many ids the tokenizer makes, where that is cheap to know (None: a hub name)."""
    from app.components.models.pretrained import local_dir, tokenizer_size

    name = cfg.data.tokenizer
    if name == "byte":  # classification adds [PAD], [CLS] and [SEP] (app/data/labelled.py)
        return 256 if cfg.task.name == "causal_lm" else 259
    if name == "train":
        return cfg.data.tokenizer_vocab_size
    directory = local_dir(name)
    return None if directory is None else tokenizer_size(directory)


def tokenizer_warning(cfg: DictConfig) -> str | None:
    """A tokenizer other than the pretrained model's own: allowed (set on purpose, since the
    default is the model's own), but the ids no longer mean what the model learned."""
    from app.components.models.pretrained import has_tokenizer, local_dir

    model_dir = local_dir(cfg.model.path) if cfg.model.arch == "pretrained" else None
    if model_dir is None or not has_tokenizer(model_dir):
        return None
    if _same_dir(cfg.data.tokenizer, model_dir):
        return None
    return (
        f"data.tokenizer={cfg.data.tokenizer} is not the tokenizer of model.path="
        f"{cfg.model.path}: its ids mean other text than the model learned"
    )


def _same_dir(name: str | None, directory: Path) -> bool:
    from app.components.models.pretrained import local_dir

    other = local_dir(name)
    return other is not None and other.resolve() == directory.resolve()


def check_precision(cfg: DictConfig, device_type: str) -> None:
    """What a CPU cannot do; a card's abilities are checked once it is detected."""
    if device_type == "cpu" and cfg.precision.name in ("fp16", "tf32"):
        raise ConfigError(
            f"precision={cfg.precision.name} needs a CUDA device; on CPU use precision=fp32, "
            "bf16 or auto"
        )


def check_text_file(path: str | Path) -> None:
    """A data file must be UTF-8 text: a binary file would train the model on garbage."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    nul = head.find(b"\0")
    if nul >= 0:
        raise ConfigError(
            f"data.paths: {path} is not text (a NUL byte at offset {nul}); give UTF-8 text files"
        )
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the end of the sample
            raise ConfigError(
                f"data.paths: {path} is not UTF-8 text (byte 0x{head[exc.start]:02x} at offset "
                f"{exc.start}); convert it to UTF-8"
            ) from None


def row_columns(cfg: DictConfig) -> list[tuple[str, str]]:
    """(setting, column) pairs every row of `data.source=datasets` must have, for this task."""
    if cfg.task.name == "classification":
        from app.components.data.labelled import wanted_columns

        return wanted_columns(cfg.data)
    return [("data.text_column", cfg.data.text_column)]


def check_rows(cfg: DictConfig) -> None:
    """Files or a saved dataset for `data.source=datasets`: there, readable, not empty, with the
    columns the task reads. Only a first row of each file set is read (streamed), and a saved
    dataset is memory-mapped, so nothing is converted or tokenized yet. A hub name is checked
    when it loads: whether it can be fetched depends on the network."""
    from app.components.data import sources

    wanted = row_columns(cfg)
    if cfg.data.dataset:
        name = str(cfg.data.dataset)
        if not sources.is_local_dataset(name):
            return
        train, val = sources.dataset_splits(sources.open_dataset(name, None), cfg.data)
        named = [("train", train), ("validation", val)]
        for split, rows in [(s, r) for s, r in named if r is not None]:
            if len(rows) == 0:
                raise ConfigError(f"data.dataset={name}: the {split} split is empty")
            sources.require_columns(rows.column_names, wanted, split)
        return
    given = [
        ("data.paths", cfg.data.paths, "train"),
        ("data.val_paths", cfg.data.val_paths, "validation"),
    ]
    for key, patterns, split in [g for g in given if g[1]]:
        fs = sources.file_set(list(patterns), key, split)
        row = sources.first_row(fs)
        if row is None:
            raise ConfigError(f"data: the {split} split is empty ({key}={', '.join(fs.files)})")
        sources.require_columns(list(row), wanted, split)


# ---------------------------------------------------------------------------------------------
# Memory


def check_step_batch(cfg: DictConfig, host_bytes: int) -> None:
    """One optimizer step's token ids must fit comfortably in host memory."""
    key = sequence_key(cfg.task.name)
    width = cfg.data[key] + 1
    step_bytes = cfg.training.effective_batch_size * width * 8
    allowed = STEP_BATCH_HOST_FRACTION * host_bytes
    if step_bytes > allowed:
        raise ConfigError(
            f"training.effective_batch_size={cfg.training.effective_batch_size}: one optimizer "
            f"step holds {step_bytes / GIB:,.1f} GiB of token ids (x {width} "
            f"tokens x 8 bytes), more than {allowed / GIB:.1f} GiB (a tenth of this machine's "
            f"{host_bytes / GIB:.1f} GiB); lower it or data.{key}"
        )


def check_model_fits(cfg: DictConfig, memory_bytes: int, where: str) -> None:
    """Weights, gradients and AdamW state must fit before a single activation does."""
    vocab = cfg.model.vocab_size or 256  # the smallest tokenizer: errs on the side of running
    params = estimate_parameters(cfg.model, vocab)
    if params is None:
        return
    need = params * TRAIN_STATE_BYTES_PER_PARAM
    if need > memory_bytes:
        m = cfg.model
        raise ConfigError(
            f"model.n_layer={m.n_layer}, model.n_embd={m.n_embd}: about {params / 1e9:,.2f}B "
            f"parameters need {need / GIB:,.1f} GiB for fp32 weights, gradients and AdamW "
            f"state, more than the {memory_bytes / GIB:.1f} GiB usable on {where}; use a "
            "smaller model"
        )


def training_memory(cfg: DictConfig, device_type: str, total_bytes: int | None) -> int | None:
    """What a run may use for its model state on this device (None: unknown, not checked)."""
    if device_type == "cpu":
        return int(host_memory_bytes() * cfg.training.auto_batch.cpu_memory_fraction)
    if total_bytes is None:
        return None
    return int(total_bytes * (1.0 - cfg.gpu.memory_headroom))


# ---------------------------------------------------------------------------------------------
# Resume


def check_resume_matches(cfg: DictConfig, checkpoint: Path, saved: dict[str, Any] | None) -> None:
    """The settings that shape the model must be those the checkpoint was trained with."""
    if saved is None:
        return
    for key in SHAPE_KEYS:
        old = _select(saved, key)
        old = SHAPE_DEFAULTS.get(key) if old is None else old
        new = OmegaConf.select(cfg, key, default=None)
        if old != new:
            raise ConfigError(
                f"training.resume={checkpoint}: the checkpoint was trained with {key}={old}, this "
                f"run has {key}={new}; resume with the same model or start a new run"
            )


def _select(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def saved_run_config(checkpoint: Path, state: dict[str, Any]) -> dict[str, Any] | None:
    """The config the checkpoint was trained with: stored in it, else its run's .hydra/."""
    if isinstance(state.get("config"), dict):
        return state["config"]
    hydra_cfg = checkpoint.parent.parent / ".hydra" / "config.yaml"
    if hydra_cfg.is_file():
        try:
            return OmegaConf.to_container(OmegaConf.load(hydra_cfg), resolve=False)
        except Exception:
            return None
    return None


# ---------------------------------------------------------------------------------------------
# All of them


class AlreadyComplete(Exception):
    """`training.resume` points at a run that reached training.max_steps: nothing to do."""


def check_start(cfg: DictConfig, run_dir: Path, device_type: str, device_total: int | None):
    """Every check of the machine and the files; returns the checkpoint to resume, if any.

    Raises ConfigError, or AlreadyComplete when the checkpoint is at max_steps already.
    """
    check_run_dir(run_dir)
    check_trackers(cfg)
    check_precision(cfg, device_type)
    check_local_paths(cfg)
    check_vocab(cfg)
    check_pretrained(cfg)
    if cfg.data.source == "text_files":
        from app.components.data.sources import expand_paths

        for path in expand_paths(list(cfg.data.paths)):
            check_text_file(path)
    if cfg.data.source == "datasets":
        check_rows(cfg)
    check_step_batch(cfg, host_memory_bytes())
    usable = training_memory(cfg, device_type, device_total)
    if usable is not None:
        check_model_fits(cfg, usable, device_type)
    if cfg.training.resume is None:
        return None
    from app.engine import checkpoint as ckpt  # torch: only when there is a checkpoint to look at

    found = ckpt.find_resume_checkpoint(cfg.training.resume, run_dir)
    if found is None:
        return None
    state = ckpt.load_checkpoint(found, mmap=True)
    check_resume_matches(cfg, found, saved_run_config(found, state))
    if int(state["step"]) >= cfg.training.max_steps:
        raise AlreadyComplete(
            f"{found} is at step {int(state['step'])} of training.max_steps="
            f"{cfg.training.max_steps}: the run is complete, nothing to do (raise "
            "training.max_steps to train further)"
        )
    return found
