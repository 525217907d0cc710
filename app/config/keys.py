"""Unknown keys, refused however they got in: Hydra's `+key=value` appends to a typed node
without asking the schema, so the composed config is walked against it before it is typed."""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, OmegaConf

from app.core.errors import ConfigError


def check_known_keys(cfg: DictConfig, path: str = "") -> None:
    """Every key of a node typed by a schema dataclass must be one of its fields."""
    schema = OmegaConf.get_type(cfg)
    fields = (
        {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    )
    # resolve=False: values may be interpolations that only resolve at run time.
    for key, child in cfg.items_ex(resolve=False):
        full = f"{path}{key!s}"
        if fields is not None and key not in fields:
            parent = path.rstrip(".")
            where = f" in {parent}" if parent else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{full}: no such setting{where}; known keys: {known}")
        if isinstance(child, DictConfig) and cfg.get(key) is not None:  # a typed null: hpo
            check_known_keys(child, f"{full}.")
