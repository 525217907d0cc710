"""Config schema: one dataclass per Hydra group, registered in the ConfigStore.

The root schema types every group, so a misspelled key or a wrong type is rejected while Hydra
composes the config. Checks that span keys (micro-batch vs effective batch, heads vs hidden size)
live in `validate()`, which raises `ConfigError` naming the key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from app.config.hpo import HpoConfig
from app.config.validation import ConfigError, check_bounds, check_known_keys

PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")
TASK_NAMES = ("causal_lm", "classification")  # app/tasks/__init__.py
# Which model.arch and data.source each task accepts (pretrained: a checkpoint of either kind).
TASK_ARCHS = {
    "causal_lm": ("gpt2", "llama", "pretrained"),
    "classification": ("deberta_v2", "bert", "roberta", "pretrained"),
}
MODEL_ARCHS = tuple(dict.fromkeys(a for archs in TASK_ARCHS.values() for a in archs))
TASK_SOURCES = {
    "causal_lm": ("builtin", "text_files", "synthetic", "datasets"),
    "classification": ("builtin", "datasets"),
}
SCHEDULES = ("cosine", "linear", "constant")
FAULT_PHASES = ("forward", "backward", "optimizer", "eval")
WANDB_MODES = ("offline", "online", "disabled")
HOST_MALLOC_POLICIES = ("retain", "default")  # app/hardware/host_malloc.py
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class GpuConfig:
    name: str = MISSING  # preset name as typed on the command line (gpu=NAME)
    device_type: str = "cuda"  # auto | cuda | cpu
    match: list[str] = field(default_factory=list)  # substrings of the NVML/torch device name
    memory_gib: float | None = None  # label memory; the detected figure wins
    compute_capability: float | None = None
    bf16: bool = False
    tf32: bool = False
    # Dense (no sparsity) peak TFLOP/s by compute dtype; empty = unknown, MFU is not reported.
    peak_tflops: dict[str, float] = field(default_factory=dict)
    precision: str = "auto"  # what precision=auto resolves to on this card
    dataloader_workers: int = 4
    memory_headroom: float = 0.10  # fraction of device memory kept free by the batch probe
    compile: bool = False  # per-card default for model.compile=null


@dataclass
class PrecisionConfig:
    name: str = "auto"  # auto | fp32 | tf32 | bf16 | fp16


@dataclass
class ModelConfig:
    name: str = MISSING
    arch: str = "gpt2"  # gpt2 | llama | pretrained
    path: str | None = None  # local checkpoint directory (arch=pretrained) or hub name
    vocab_size: int | None = None  # null: taken from the tokenizer
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int | None = None  # llama only; null = n_head
    n_embd: int = 128
    intermediate_size: int | None = None  # null: 4 x n_embd (gpt2) or the llama default
    max_position_embeddings: int = 256
    dropout: float = 0.0
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2
    gradient_checkpointing: bool = False
    compile: bool | None = None  # null: the gpu preset decides
    compile_mode: str = "default"  # default | reduce-overhead | max-autotune


@dataclass
class DataConfig:
    name: str = MISSING
    # builtin (the task's generated corpus) | text_files | synthetic (causal LM)
    # | datasets (files or a dataset through the `datasets` library: app/data/sources.py)
    source: str = "builtin"
    paths: list[str] = field(default_factory=list)  # files or globs (text_files, datasets)
    # byte | train | <local path or hub name>. The data groups default to the model's own
    # tokenizer for model=pretrained, else byte or train (see model_tokenizer below).
    tokenizer: str = "${model_tokenizer:byte}"
    tokenizer_vocab_size: int = 2048  # for tokenizer=train
    seq_len: int = 128  # causal LM: block size, tokens per packed sequence
    val_fraction: float = 0.05
    builtin_num_docs: int = 4000  # size of the generated corpus (source=builtin): docs or rows
    # Rows through `datasets` (source=datasets, either task)
    val_paths: list[str] = field(default_factory=list)  # a validation set of files of its own
    dataset: str | None = None  # a save_to_disk directory or a hub name (source=datasets)
    dataset_config: str | None = None  # the hub dataset's configuration, e.g. mnli of glue
    train_split: str = "train"
    val_split: str = "validation"  # held out from train by val_fraction when absent
    text_column: str = "text"
    map_num_proc: Any = "auto"  # auto (several processes for large data only) | int
    # Labelled data (task=classification): app/data/labelled.py
    text_pair_column: str | None = "text_pair"  # null for single texts
    label_column: str = "label"
    max_length: int = 128  # tokens per sample after truncation (pairs: both texts)
    length_grouping: bool = True  # steps of similar lengths: less padding
    group_steps: int = 50  # ... sorted within groups of this many steps' samples
    synthetic_num_tokens: int = 2_000_000  # source=synthetic
    cache_dir: str = "${oc.env:HYDRATRAIN_CACHE,.cache/hydratrain}"
    num_workers: Any = "auto"  # auto | int
    pin_memory: bool | None = None  # null: on for CUDA
    persistent_workers: bool = True
    prefetch_factor: int = 2
    seed: int = 1234


@dataclass
class AutoBatchConfig:
    """How training.micro_batch_size=auto is resolved (see app/batch/plan.py)."""

    max_micro_batch: int = 1024
    max_probe_steps: int = 40
    max_probe_seconds: float = 120.0
    throughput_aware: bool = True
    cache: bool = True
    cache_dir: str | None = None  # null: <data.cache_dir>/autobatch
    cpu_max_micro_batch: int = 64
    cpu_memory_fraction: float = 0.5
    oom_recovery: bool = True


@dataclass
class ProfilerConfig:
    """A torch.profiler window over optimizer steps (app/profiling.py); steps=0: off."""

    steps: int = 0  # how many optimizer steps to record
    start_step: int = 5  # the first of them, after the warm-up steps
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False


@dataclass
class TrainingConfig:
    effective_batch_size: int = 32  # samples per optimizer step, all ranks together
    micro_batch_size: Any = 8  # auto | int
    max_steps: int = 300
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # the schedule ends at lr * min_lr_ratio
    schedule: str = "cosine"  # cosine | linear | constant
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    fused_adamw: bool | None = None  # null: fused on CUDA
    max_grad_norm: float = 1.0  # 0 disables clipping
    eval_every: int = 50
    # Validation sequences (the first N blocks of the held-out split; fewer if it is smaller).
    # Fixed in samples, not batches, so trials with different micro-batches score the same set.
    eval_samples: int = 128
    # Evaluation micro-batch: null = the training micro-batch; auto = EVAL_FACTOR times it (no
    # backward, no saved activations: it fits, and the probe checks that it does); or an int.
    eval_micro_batch_size: Any = None
    eval_at_start: bool = True  # a step-0 validation loss to compare the end against
    log_every: int = 10
    checkpoint_every: int = 100  # 0: only at the end
    keep_checkpoints: int = 2
    seed: int = 1337
    resume: str | None = None  # null | auto (this run dir) | path to a run dir or checkpoint
    progress_bar: bool = True
    # Host malloc policy (app/hardware/host_malloc.py): retain | default. retain keeps freed
    # memory for the next step instead of page-faulting it back in from the kernel every step.
    host_malloc: str = "retain"
    # PYTORCH_CUDA_ALLOC_CONF's expandable_segments (app/hardware/cuda_alloc.py): true or false
    # is merged into the variable before CUDA starts; null leaves the environment's setting.
    expandable_segments: bool | None = None
    # torch.cuda.empty_cache() after each evaluation (CUDA only): hands the evaluation's cached
    # blocks back to the driver, at the cost of allocating them again in the next steps.
    empty_cache_after_eval: bool = False
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    # Write <run dir>/model (Hugging Face format: config, safetensors, tokenizer) when the run
    # completes; `python -m app.export` writes it from any checkpoint too.
    export: bool = True
    auto_batch: AutoBatchConfig = field(default_factory=AutoBatchConfig)


@dataclass
class TaskConfig:
    """What is learned (app/tasks/): the loss, its unit, the metrics, the model head."""

    name: str = "causal_lm"  # causal_lm | classification
    label_smoothing: float = 0.0  # classification training loss (evaluation: plain CE)
    labels: list[str] | None = None  # classification: label names in id order; null: the data's


@dataclass
class FaultsConfig:
    """Fault injection for tests and CPU users: see README, 'Fault injection'."""

    oom_above_micro_batch: int | None = None
    oom_phase: str = "forward"  # forward | backward | optimizer | eval
    oom_from_step: int = 0  # first optimizer step at which the fault fires
    oom_rank: int | None = None  # under torchrun: only this rank fails (null: every rank)


@dataclass
class WandbConfig:
    """Weights & Biases (pip extra `wandb`). Offline by default: no account, no network."""

    enabled: bool = False
    project: str = "hydratrain"
    entity: str | None = None
    mode: str = "offline"  # offline | online | disabled
    dir: str | None = None  # null: the run dir (W&B writes <dir>/wandb/)
    name: str | None = None  # null: the run dir's last two parts
    group: str | None = None  # null: the study's name under hpo, else none
    tags: list[str] = field(default_factory=list)


@dataclass
class MlflowConfig:
    """MLflow (pip extra `mlflow`). A local SQLite database by default, any tracking URI by
    config. MLflow 3 refuses a bare file store unless MLFLOW_ALLOW_FILE_STORE=true."""

    enabled: bool = False
    tracking_uri: str = "sqlite:///outputs/mlflow/mlflow.db"  # relative paths: the working dir
    experiment: str = "hydratrain"
    run_name: str | None = None  # null: the run dir's last two parts
    # Where a new experiment keeps its artifacts; null: beside a SQLite database, else the
    # server's default.
    artifact_location: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class TrackingConfig:
    """Experiment trackers beside TensorBoard and metrics.jsonl (app/tracking/)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)


@dataclass
class TrainConfig:
    gpu: GpuConfig = MISSING
    precision: PrecisionConfig = MISSING
    data: DataConfig = MISSING
    model: ModelConfig = MISSING
    training: TrainingConfig = MISSING
    task: TaskConfig = field(default_factory=TaskConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    hpo: HpoConfig | None = None  # set by hpo=optuna; read by the sweeper and the trial reporter
    # summary.json key main() returns, or a list of keys for multi-objective studies
    objective: Any = "final_val_loss"


def model_tokenizer(fallback: str, *, _root_: DictConfig) -> str | None:
    """`data.tokenizer: ${model_tokenizer:byte}`: a pretrained model's own tokenizer (its
    model.path), else `fallback` for a model trained from scratch. Without it the default data
    would feed byte ids to a BPE model; a tokenizer set explicitly still wins."""
    if OmegaConf.select(_root_, "model.arch", default=None) == "pretrained":
        return OmegaConf.select(_root_, "model.path", default=None)
    return fallback


if not OmegaConf.has_resolver("model_tokenizer"):
    OmegaConf.register_new_resolver("model_tokenizer", model_tokenizer)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)


def _one_of(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate(cfg: DictConfig) -> None:
    """Device-independent checks run before any expensive work; raise ConfigError."""
    check_known_keys(cfg)
    check_bounds(cfg)
    _one_of("task.name", cfg.task.name, TASK_NAMES)
    _one_of("precision", cfg.precision.name, PRECISIONS)
    _one_of("gpu.device_type", cfg.gpu.device_type, ("auto", "cuda", "cpu"))
    _validate_preset_precision(cfg.gpu, cfg.precision.name)
    _validate_task_fit(cfg.task.name, cfg.model, cfg.data)
    _validate_labels(cfg.task.labels)
    _validate_builtin_columns(cfg.task.name, cfg.data)
    _validate_model(cfg.model, cfg.data, sequence_key(cfg.task.name))
    _validate_data(cfg.data)
    _validate_training(cfg.training)
    _validate_faults(cfg.faults)
    _validate_tracking(cfg.tracking)


def _validate_preset_precision(gpu: DictConfig, requested: str) -> None:
    """bf16/TF32 asked of a CUDA preset that lacks it: caught without touching a device."""
    if gpu.device_type != "cuda" or requested not in ("bf16", "tf32"):
        return
    if not (gpu.bf16 if requested == "bf16" else gpu.tf32):
        raise ConfigError(
            f"precision={requested} is not supported by gpu={gpu.name} (compute capability "
            f"{gpu.compute_capability}, needs >= 8.0); use precision=fp16 or precision=auto"
        )
    _one_of("gpu.precision", gpu.precision, PRECISIONS)


def sequence_key(task: str) -> str:
    """The data setting that bounds a sample's length: seq_len (blocks) or max_length (rows)."""
    return "seq_len" if task == "causal_lm" else "max_length"


def _validate_task_fit(task: str, m: DictConfig, d: DictConfig) -> None:
    archs, sources = TASK_ARCHS[task], TASK_SOURCES[task]
    _one_of("model.arch", m.arch, MODEL_ARCHS)
    _one_of(
        "data.source", d.source, tuple(dict.fromkeys(s for v in TASK_SOURCES.values() for s in v))
    )
    if m.arch not in archs:
        kind = "a causal LM" if m.arch in TASK_ARCHS["causal_lm"] else "a classifier"
        raise ConfigError(
            f"model.arch={m.arch!r} is {kind}, not a model for task={task}; "
            f"choose one of: {', '.join(archs)}"
        )
    if d.source not in sources:
        raise ConfigError(
            f"data.source={d.source!r} does not serve task={task}; choose one of: "
            f"{', '.join(sources)}"
        )


def _validate_labels(labels: Any) -> None:
    """task.labels are the classes' names in id order: a name given twice would map two ids to
    one name (the export's label2id keeps only the last)."""
    if not labels:
        return
    names = [str(n) for n in labels]
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise ConfigError(
            f"task.labels={names} names {twice[0]!r} more than once; allowed: distinct names"
        )
    if len(names) < 2:
        raise ConfigError(f"task.labels={names} names one label; allowed: at least 2")


def _validate_builtin_columns(task: str, d: DictConfig) -> None:
    """task=classification with data.source=builtin reads the built-in NLI corpus: a column it
    lacks most often means a causal-LM data config (data=tiny_corpus, the default) was kept."""
    if task != "classification" or d.source != "builtin":
        return
    from app.components.data.nli_corpus import COLUMNS

    wanted = [
        ("data.text_column", d.text_column),
        ("data.text_pair_column", d.text_pair_column),
        ("data.label_column", d.label_column),
    ]
    for key, column in wanted:
        if column is not None and column not in COLUMNS:
            raise ConfigError(
                f"{key}={column!r} is not a column of the built-in NLI corpus that data={d.name} "
                f"gives task=classification ({', '.join(COLUMNS)}); labelled data: data=tiny_nli, "
                "data=mnli, or data.source=datasets with your files"
            )


def _validate_model(m: DictConfig, d: DictConfig, seq_key: str) -> None:
    _one_of("model.arch", m.arch, MODEL_ARCHS)
    _one_of("model.attn_implementation", m.attn_implementation, ATTN_IMPLEMENTATIONS)
    _one_of("model.compile_mode", m.compile_mode, COMPILE_MODES)
    if m.arch == "pretrained":
        if not m.path:
            raise ConfigError("model.path is required when model.arch=pretrained")
        return
    if m.n_embd % m.n_head:
        raise ConfigError(
            f"model.n_embd={m.n_embd} must be divisible by model.n_head={m.n_head} "
            f"(allowed n_head: {', '.join(str(h) for h in _divisors(m.n_embd))})"
        )
    if m.n_kv_head is not None and m.n_head % m.n_kv_head:
        raise ConfigError(f"model.n_kv_head={m.n_kv_head} must divide model.n_head={m.n_head}")
    if d[seq_key] > m.max_position_embeddings:
        raise ConfigError(
            f"data.{seq_key}={d[seq_key]} exceeds model.max_position_embeddings="
            f"{m.max_position_embeddings}; use data.{seq_key}<={m.max_position_embeddings}"
        )


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, min(n, 64) + 1) if n % k == 0]


def _validate_data(d: DictConfig) -> None:
    if d.source == "text_files" and not d.paths:
        raise ConfigError("data.paths is empty; data.source=text_files needs files or globs")
    if d.source == "datasets" and not (d.paths or d.dataset):
        raise ConfigError(
            "data.source=datasets needs data.paths (JSONL, CSV or Parquet files) or "
            "data.dataset (a save_to_disk directory or a hub name)"
        )
    _auto_or_count("data.num_workers", d.num_workers, 0, "auto or an integer >= 0")
    _auto_or_count("data.map_num_proc", d.map_num_proc, 1, "auto or an integer >= 1")


def _auto_or_count(key: str, value: Any, low: int, allowed: str, nullable: bool = False) -> None:
    """A setting that is `auto` (or null where `nullable`) or an integer >= low."""
    if value == "auto" or (nullable and value is None):
        return
    if not (_is_count(value) and value >= low):
        raise ConfigError(f"{key}={value!r} must be {allowed}")


def _validate_training(t: DictConfig) -> None:
    _auto_or_count("training.micro_batch_size", t.micro_batch_size, 1, "auto or a positive integer")
    if t.micro_batch_size != "auto" and t.micro_batch_size > t.effective_batch_size:
        raise ConfigError(
            f"training.micro_batch_size={t.micro_batch_size} is larger than "
            f"training.effective_batch_size={t.effective_batch_size}; allowed: auto or "
            f"1..{t.effective_batch_size}"
        )
    _auto_or_count(
        "training.eval_micro_batch_size",
        t.eval_micro_batch_size,
        1,
        "null (the training micro-batch), auto or a positive integer",
        nullable=True,
    )
    _one_of("training.schedule", t.schedule, SCHEDULES)
    _one_of("training.host_malloc", t.host_malloc, HOST_MALLOC_POLICIES)
    if t.lr * t.weight_decay >= 1.0:
        # AdamW's decoupled decay multiplies every weight by (1 - lr * weight_decay) per step.
        raise ConfigError(
            f"training.weight_decay={t.weight_decay} with training.lr={t.lr} shrinks every weight "
            f"by lr*weight_decay={t.lr * t.weight_decay:g} per step; allowed: lr*weight_decay < 1"
        )
    betas = list(t.betas)
    if len(betas) != 2 or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"training.betas={betas} must be two numbers in [0, 1)")
    p = t.profiler
    if p.steps and p.start_step >= t.max_steps:
        raise ConfigError(
            f"training.profiler.start_step={p.start_step} is not a step of this run "
            f"(training.max_steps={t.max_steps}); allowed: 0..{t.max_steps - 1}"
        )


def _validate_faults(f: DictConfig) -> None:
    _one_of("faults.oom_phase", f.oom_phase, FAULT_PHASES)


def _validate_tracking(t: DictConfig) -> None:
    _one_of("tracking.wandb.mode", t.wandb.mode, WANDB_MODES)
    for key, value in (
        ("tracking.wandb.project", t.wandb.project),
        ("tracking.mlflow.experiment", t.mlflow.experiment),
        ("tracking.mlflow.tracking_uri", t.mlflow.tracking_uri),
    ):
        if not str(value).strip():
            raise ConfigError(f"{key}={value!r} must not be empty")
