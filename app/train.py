"""Entrypoint: `python -m app.train [GROUP=OPTION ...] [key=value ...]`.

`main()` is the Hydra task and returns the objective, so the same function is the Optuna objective
under `-m hpo=optuna`. The composed config is typed here, once (`load_config`); below, every
function takes the typed slice it needs. Heavy imports (torch, transformers) wait until a run
really starts, so `--help` and `--cfg job` answer at once.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import hydra
from omegaconf import DictConfig

from app.cli.preflight import preflight
from app.config.schema import load_config, register_configs
from app.core.errors import ConfigError, say
from app.core.outcomes import Preempted, RunOutcome
from app.core.run_dir_guard import restore_after_refusal

register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | list[float]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from app.engine.ranks import run_ranks, trial_ranks
    from app.engine.runner import run_training

    hc = HydraConfig.get()
    try:
        config = load_config(cfg)
        if (ranks := trial_ranks(config)) > 1:  # hpo.gpus_per_trial: DDP through torchrun's API
            return run_ranks(config, hc.runtime.output_dir, ranks)
        summary = run_training(config, run_dir=hc.runtime.output_dir)
    except (ConfigError, RunOutcome) as exc:
        if hc.mode == RunMode.MULTIRUN:
            raise  # the sweeper maps it to the trial's state, with this message
        if isinstance(exc, ConfigError):
            restore_after_refusal()  # what Hydra and the loggers wrote before the refusal
        end_with_one_line(exc)
    return summary.objective(config.objective_keys)


def end_with_one_line(exc: Exception) -> NoReturn:
    """A single run that cannot go on ends with one line and a status that says why:
    2 a setting, 128 + signal number a preemption (the checkpoint is saved), 1 otherwise."""
    if isinstance(exc, Preempted):
        say(f"stopped: {exc}")
        sys.exit(128 + exc.signum)
    say(f"error: {exc}")
    sys.exit(2 if isinstance(exc, ConfigError) else 1)


def cli() -> None:
    preflight(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
