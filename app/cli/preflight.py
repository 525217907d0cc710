"""Check the command line before Hydra runs: bad input ends in one line, and touches nothing.

Hydra's own messages for an unknown option or key span several lines, and by the time the task
function runs Hydra has already written `.hydra/` (and a log file) into the run directory. So the
same composition is done here first, any error is reduced to one line that names the setting and
what is allowed, and the checks of the machine and the files (app/checks.py) run too: a refused
run leaves an existing run directory byte for byte as it was.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from app.engine.start_checks import AlreadyComplete
from app.config.schema import ConfigError, register_configs, validate
from app.config.validation import first_line

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# Flags after which preflight steps aside: Hydra answers them itself.
_SKIP_FLAGS = {
    "-h",
    "--help",
    "--hydra-help",
    "--info",
    "-i",
    "--shell-completion",
    "-sc",
    "--experimental-rerun",
}
# Flags that print the config instead of running the job: validate, but check nothing on disk.
_PRINT_FLAGS = {"--cfg", "-c", "--package", "-p", "--resolve"}
_MULTIRUN_FLAGS = {"-m", "--multirun"}
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-dir", "-cd"}


@dataclass
class Invocation:
    """What the command line asks of Hydra, as far as preflight cares."""

    config_name: str = "train"
    overrides: list[str] = field(default_factory=list)  # the job's own
    hydra_overrides: list[str] = field(default_factory=list)  # hydra.run.dir=..., and the like
    runs_job: bool = True  # False for --cfg and friends: nothing is written
    config_dirs: list[str] = field(default_factory=list)  # --config-dir: extra search path
    multirun: bool = False  # -m: the sweeper samples values and validates each job itself


def split_argv(argv: list[str]) -> Invocation | None:
    """The invocation, or None when preflight should step aside."""
    inv, i = Invocation(), 0
    while i < len(argv):
        arg = argv[i]
        flag = arg.split("=", 1)[0]
        if arg in _SKIP_FLAGS or flag in _SKIP_FLAGS:
            return None
        if flag in _PRINT_FLAGS:
            inv.runs_job = False
        if arg in _MULTIRUN_FLAGS:
            inv.multirun = True
        if arg in ("--config-name", "-cn"):
            inv.config_name, i = argv[i + 1], i + 2
            continue
        if arg in ("--config-dir", "-cd"):
            inv.config_dirs.append(str(Path(argv[i + 1]).absolute()))
        if arg in _VALUE_FLAGS:
            i += 2
            continue
        if not arg.startswith("-"):
            is_hydra = arg.lstrip("+~").startswith(("hydra.", "hydra/"))
            (inv.hydra_overrides if is_hydra else inv.overrides).append(arg)
        i += 1
    return inv


def compose(name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(
            config_name=name, overrides=overrides, return_hydra_config=return_hydra_config
        )


def preflight(argv: list[str]) -> None:
    inv = split_argv(argv)
    if inv is None:
        return
    try:
        if inv.multirun:
            _compose_sweep(inv)
            return
        cfg, run_dir = _compose_job(inv)
        validate(cfg)
        if inv.runs_job and run_dir is not None:
            _check_machine(cfg, run_dir)
    except AlreadyComplete as done:
        print(f"done       {done}", flush=True)
        sys.exit(0)
    except ConfigError as exc:
        _fail(str(exc))
    except Exception as exc:  # Hydra/OmegaConf composition errors
        _fail(one_line(exc, inv.config_name))


def _compose_job(inv: Invocation) -> tuple[DictConfig, Path | None]:
    """The job's config (without the hydra node) and the run directory Hydra will use."""
    searchpath = [f"hydra.searchpath=[{','.join('file://' + d for d in inv.config_dirs)}]"]
    extra = searchpath if inv.config_dirs else []
    cfg = compose(
        inv.config_name, inv.overrides + inv.hydra_overrides + extra, return_hydra_config=True
    )
    try:
        run_dir: Path | None = Path(str(cfg.hydra.run.dir))
    except Exception:  # a run dir that only resolves inside Hydra's job: checked by the run
        run_dir = None
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, run_dir


def _compose_sweep(inv: Invocation) -> None:
    """Compose the sweep's base config as Hydra will (sweep expressions left to the sweeper),
    so a misspelled key or option is one line here rather than Hydra's message."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed = [o for o in inv.overrides if not parser.parse_override(o).is_sweep_override()]
    compose(inv.config_name, fixed + inv.hydra_overrides, return_hydra_config=True)


def _check_machine(cfg: DictConfig, run_dir: Path) -> None:
    from app.engine.start_checks import check_start
    from app.components.hardware.memory import (
        cuda_device_count_without_context,
        cuda_total_memory_without_context,
    )

    wants = cfg.gpu.device_type
    on_cuda = wants == "cuda" or (wants == "auto" and cuda_device_count_without_context() > 0)
    if on_cuda:
        import torch  # the run's own test for a device, so both agree

        if not torch.cuda.is_available():
            if wants == "cuda":
                raise ConfigError(
                    f"gpu={cfg.gpu.name} needs a CUDA device but torch sees none "
                    "(torch.cuda.is_available() is False); use gpu=cpu or gpu=auto"
                )
            on_cuda = False
    total = cuda_total_memory_without_context() if on_cuda else None
    check_start(cfg, run_dir, "cuda" if on_cuda else "cpu", total)


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
