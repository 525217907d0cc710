"""Check the command line before Hydra runs: bad input ends in one line, not a wall of text.

Hydra's own messages for an unknown option or key span several lines; here the same composition
is done first and any error is reduced to one line that names the setting and what is allowed,
then `validate()` checks values across keys. Nothing has been created or loaded at this point.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from app.config import ConfigError, register_configs, validate

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
# Flags after which preflight steps aside: Hydra answers them itself, or the sweeper validates.
_SKIP_FLAGS = {
    "-m",
    "--multirun",
    "-h",
    "--help",
    "--hydra-help",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--experimental-rerun",
}
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-dir", "-cd"}


def split_argv(argv: list[str]) -> tuple[str, list[str]] | None:
    """(config name, overrides) from the command line, or None when preflight should not run."""
    name, overrides, i = "train", [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in _SKIP_FLAGS or arg.split("=", 1)[0] in _SKIP_FLAGS:
            return None
        if arg in ("--config-name", "-cn"):
            name, i = argv[i + 1], i + 2
            continue
        if arg in _VALUE_FLAGS:
            i += 2
            continue
        if not arg.startswith("-") and not arg.lstrip("+~").startswith(("hydra.", "hydra/")):
            overrides.append(arg)
        i += 1
    return name, overrides


def compose(name: str, overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name=name, overrides=overrides)


def preflight(argv: list[str]) -> None:
    split = split_argv(argv)
    if split is None:
        return
    try:
        cfg = compose(*split)
        validate(cfg)
    except ConfigError as exc:
        _fail(str(exc))
    except Exception as exc:  # Hydra/OmegaConf composition errors
        _fail(one_line(exc, split[0]))


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def one_line(exc: BaseException, config_name: str = "train") -> str:
    from hydra.errors import MissingConfigException

    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        allowed = ", ".join(sorted(exc.options or [])) or "(none)"
        if group:
            return f"{group}={option} is not an option of '{group}'; choose one of: {allowed}"
        return f"config '{option}' not found"
    cause = exc.__cause__ or exc
    key = getattr(cause, "full_key", None)
    text = _first_line(cause)
    if key and "not in" in text:
        parent = key.rpartition(".")[0]
        allowed = _keys_of(config_name, parent)
        return f"{key}: no such setting{' in ' + parent if parent else ''}; known keys: {allowed}"
    if key:
        return f"{key}: {text}"
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _keys_of(config_name: str, parent: str) -> str:
    try:
        node = compose(config_name, [])
        if parent:
            node = OmegaConf.select(node, parent)
        return ", ".join(sorted(str(k) for k in node))
    except Exception:
        return "see --cfg job"
