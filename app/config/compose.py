"""Composing the config as Hydra does, and Hydra's composition errors in one line."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from app.config.schema import register_configs
from app.config.shapes import wrong_shape
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


def one_line(exc: BaseException, config_name: str = "train", overrides: Sequence[str] = ()) -> str:
    """A composition error (unknown option, key, type or shape) as one line naming the
    setting; `overrides`: the command line's, to tell which one a value of the wrong shape
    came from and what the setting takes without it."""
    from hydra.errors import MissingConfigException

    if line := group_choice_error(overrides, config_name):
        return line
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        allowed = ", ".join(exc.options or group_options(config_name, group)) or "(none)"
        if group:
            return f"{group}={option} is not an option of '{group}'; choose one of: {allowed}"
        return f"config '{option}' not found"
    if line := _shape_error(exc, config_name, overrides):
        return line
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


def group_options(config_name: str, group: str) -> list[str]:
    """The options of a config group (an empty list for a name that is not a group)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return sorted(GlobalHydra.instance().config_loader().get_group_options(group))


def group_choice_error(overrides: Sequence[str], config_name: str = "train") -> str | None:
    """A group given something other than one option's name: `training=5` (Hydra: "Config
    group override must be a string"), `model=[1]` (a TypeError of its own), or a list of
    options for a group that fills one node (`gpu=[cpu,h100]`: Hydra merges both presets and
    the last silently wins). Overlays such as `+sweeps=...` may be listed."""
    for text in overrides:
        parsed = _parsed(text)
        if parsed is None or parsed.is_sweep_override() or parsed.is_delete():
            continue
        group, value = parsed.key_or_group, parsed.value()
        if isinstance(value, str) or "." in group or "/" in group:
            continue
        options = group_options(config_name, group)
        if not options:
            continue
        listed = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if listed and not _fills_one_node(config_name, group):
            continue
        raw = text.split("=", 1)[1]
        return f"{group}={raw} is not an option of '{group}'; choose one of: {', '.join(options)}"
    return None


def _fills_one_node(config_name: str, group: str) -> bool:
    """The group's options are presets of one node (gpu, model, ...), not overlays of the
    whole config (`# @package _global_`, as sweeps/ and experiment/ are)."""
    try:
        return group in compose(config_name, [])
    except Exception:
        return True


def _parsed(text: str):  # -> hydra Override | None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(text)
    except Exception:
        return None


def _shape_error(exc: BaseException, config_name: str, overrides: Sequence[str]) -> str | None:
    """A value of the wrong shape for its setting (app/config/shapes.py), from the override
    Hydra names in "Error merging override KEY=VALUE"."""
    found = re.match(r"Error merging override (.+)", str(exc).strip(), re.S)
    if found is None:
        return None
    text = found.group(1).strip()
    parsed = _parsed(text)
    if parsed is None or parsed.is_sweep_override():
        return None
    key = parsed.key_or_group
    others = [o for o in overrides if o != text]
    try:
        node = OmegaConf.select(compose(config_name, others), key)
    except Exception:
        return None
    return wrong_shape(key, parsed.value(), text.split("=", 1)[1], node)
