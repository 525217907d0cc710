"""Check the command line before Hydra runs: bad input ends in one line, and touches nothing.

Hydra's own messages for an unknown option or key span several lines and end in exit status 1.
So the same composition is done here first and any error is reduced to one line that names the
setting and what is allowed, with status 2. The config's own checks and those of the machine and
the files run in a Hydra callback once Hydra has composed the job, before it creates or writes
the run directory (app/cli/callbacks.py): a refused run leaves an existing run directory byte
for byte as it was. `--cfg` and friends print the config without running a job (no callback),
so their config is checked here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.config.compose import compose, group_choice_error, one_line
from app.config.schema import load_config
from app.core.errors import ConfigError, fail

if TYPE_CHECKING:
    from omegaconf import DictConfig

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


def preflight(argv: list[str]) -> None:
    inv = split_argv(argv)
    if inv is None:
        return
    if inv.multirun and not inv.runs_job:
        fail(
            "-m with --cfg, --package or --resolve: Hydra prints one job's config, not a "
            "study's; to see a trial's config, run without -m with its overrides (they are in "
            "<sweep dir>/<trial number>/.hydra/overrides.yaml): python -m app.train "
            "hpo=optuna <overrides> --cfg job"
        )
    if line := group_choice_error(inv.overrides, inv.config_name):
        fail(line)  # before Hydra merges two presets of one group, the last silently winning
    try:
        cfg = compose(inv.config_name, _overrides(inv), return_hydra_config=True)
        if not inv.runs_job and not inv.multirun:
            load_config(_job_part(cfg))
    except ConfigError as exc:
        fail(str(exc))
    except Exception as exc:  # Hydra/OmegaConf composition errors
        fail(_without_study(inv) or one_line(exc, inv.config_name, _overrides(inv)))
    if inv.runs_job and not inv.multirun and cfg.get("hpo") is not None:
        print(
            "note: a study is configured (hpo) but -m is not given: this is one plain run of "
            "the base config; add -m to run the study: python -m app.train -m " + " ".join(argv),
            file=sys.stderr,
            flush=True,
        )


def _without_study(inv: Invocation) -> str | None:
    """An hpo.* setting on a config with no study (hpo: null), which Hydra reports as
    "Unexpected type for root: NoneType": say what to add."""
    keys = [o for o in inv.overrides if o.lstrip("+~").startswith("hpo.")]
    if not keys:
        return None
    rest = replace(inv, overrides=[o for o in inv.overrides if o not in keys])
    try:
        if compose(rest.config_name, _overrides(rest)).get("hpo") is not None:
            return None
    except Exception:
        return None
    return (
        f"{keys[0]}: this config has no study to set (hpo is null); add hpo=optuna and -m: "
        f"python -m app.train -m hpo=optuna {' '.join(keys)}"
    )


def _overrides(inv: Invocation) -> list[str]:
    """What Hydra will compose: under -m, the sweep's base config (sweep expressions are the
    sweeper's); --config-dir as the search path it adds."""
    overrides = inv.overrides
    if inv.multirun:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        overrides = [o for o in overrides if not parser.parse_override(o).is_sweep_override()]
    dirs = ",".join("file://" + d for d in inv.config_dirs)
    searchpath = [f"hydra.searchpath=[{dirs}]"] if inv.config_dirs else []
    return [*overrides, *inv.hydra_overrides, *searchpath]


def _job_part(cfg: DictConfig) -> DictConfig:
    from omegaconf import open_dict

    with open_dict(cfg):
        del cfg["hydra"]
    return cfg
