"""Composing the config as Hydra does, and Hydra's composition errors in one line."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from app.config.schema import register_configs
from app.core.errors import first_line

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose(name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """conf/<name>.yaml with `overrides`, as `python -m app.train` composes it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(
            config_name=name, overrides=overrides, return_hydra_config=return_hydra_config
        )


def one_line(exc: BaseException, config_name: str = "train") -> str:
    """A composition error (unknown option, key or type) as one line naming the setting."""
    from hydra.errors import MissingConfigException

    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        allowed = ", ".join(sorted(exc.options or [])) or "(none)"
        if group:
            return f"{group}={option} is not an option of '{group}'; choose one of: {allowed}"
        return f"config '{option}' not found"
    cause = exc.__cause__ or exc
    key = getattr(cause, "full_key", None)
    text = first_line(cause)
    if key is None and (found := _key_error_in(str(exc))):
        key, text = found
    if key and "not in" in text:
        parent = key.rpartition(".")[0]
        allowed = _keys_of(config_name, parent)
        return f"{key}: no such setting{' in ' + parent if parent else ''}; known keys: {allowed}"
    if key and "is not Optional" in text:  # OmegaConf: "field 'a.b' is not Optional"
        return f"{key}=null is not allowed; give a value (see --cfg job for its default)"
    if key:
        return f"{key}: {text}"
    return first_line(exc)


def _key_error_in(message: str) -> tuple[str, str] | None:
    """(full_key, what is wrong) from an error Hydra reports below a line of its own, as for a
    bad key in a config file (`hpo: {n_trail: 5}` in an experiment)."""
    found = re.search(r"^(.+)\n\s*full_key: (\S+)", message, re.M)
    return (found.group(2), found.group(1).strip()) if found else None


def _keys_of(config_name: str, parent: str) -> str:
    try:
        node = compose(config_name, [])
        if parent:
            node = OmegaConf.select(node, parent)
        return ", ".join(sorted(str(k) for k in node))
    except Exception:
        return "see --cfg job"
