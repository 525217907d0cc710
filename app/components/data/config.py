"""The `data` group: where the samples come from, how they are tokenized, how they are loaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from app.core.fields import auto_count, auto_or_count, bounded, count, positive_int


@dataclass
class DataConfig:
    name: str = MISSING
    # a module of app/components/data/sources/: builtin (the task's generated corpus),
    # text_files, datasets (files or a dataset through the `datasets` library), ...
    source: str = "builtin"
    paths: list[str] = field(default_factory=list)  # files or globs (text_files, datasets)
    # byte | train | <local path or hub name>. The data groups default to the model's own
    # tokenizer for model=pretrained, else byte or train (app/config/schema.py model_tokenizer).
    tokenizer: str = "${model_tokenizer:byte}"
    tokenizer_vocab_size: int = bounded(2048, low=257, integer=True)  # for tokenizer=train
    seq_len: int = positive_int(128)  # causal LM: block size, tokens per packed sequence
    val_fraction: float = bounded(0.05, low=0.0, high=0.5, low_open=True, high_open=True)
    # size of the generated corpus (source=builtin): docs or rows
    builtin_num_docs: int = bounded(4000, low=2, integer=True)
    # Rows through `datasets` (source=datasets, either task)
    val_paths: list[str] = field(default_factory=list)  # a validation set of files of its own
    dataset: str | None = None  # a save_to_disk directory or a hub name (source=datasets)
    dataset_config: str | None = None  # the hub dataset's configuration, e.g. mnli of glue
    train_split: str = "train"
    val_split: str = "validation"  # held out from train by val_fraction when absent
    text_column: str = "text"
    map_num_proc: Any = "auto"  # auto (several processes for large data only) | int
    # Labelled data (task=classification): app/components/data/labelled/texts.py
    text_pair_column: str | None = "text_pair"  # null for single texts
    label_column: str = "label"
    # tokens per sample after truncation (pairs: both texts); at least [CLS] and [SEP]
    max_length: int = bounded(128, low=2, integer=True)
    length_grouping: bool = True  # steps of similar lengths: less padding
    group_steps: int = positive_int(50)  # ... sorted within groups of this many steps' samples
    synthetic_num_tokens: int = bounded(2_000_000, low=2, integer=True)  # source=synthetic
    cache_dir: str = "${oc.env:HYDRATRAIN_CACHE,.cache/hydratrain}"
    num_workers: Any = "auto"  # auto | int
    pin_memory: bool | None = None  # null: on for CUDA
    persistent_workers: bool = True
    prefetch_factor: int = positive_int(2)
    seed: int = count(1234)

    def __post_init__(self) -> None:
        # The `auto | int` settings typed once, as the config is built (OmegaConf types no
        # such union): None is auto. What check() refuses reads as auto; nothing runs before it.
        self.fixed_map_num_proc: int | None = auto_count(self.map_num_proc)
        self.fixed_num_workers: int | None = auto_count(self.num_workers)

    def check(self) -> None:
        """What spans this group's fields (the source's own settings are checked with the task
        they serve: app/config/schema.py)."""
        auto_or_count("data.num_workers", self.num_workers, 0, "auto or an integer >= 0")
        auto_or_count("data.map_num_proc", self.map_num_proc, 1, "auto or an integer >= 1")
