"""Entrypoint: `python -m app.train [GROUP=OPTION ...] [key=value ...]`.

`main()` is the Hydra task and returns the objective, so the same function is the Optuna objective
under `-m hpo=optuna`. Heavy imports (torch, transformers) wait until a run really starts, so
`--help` and `--cfg job` answer at once.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from app.config.schema import ConfigError, register_configs
from app.core.outcomes import RunOutcome
from app.cli.preflight import preflight
from app.cli.run_dir_guard import restore_after_refusal

register_configs()


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | list[float]:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from app.hpo import objective_value
    from app.engine.runner import run_training

    hc = HydraConfig.get()
    try:
        summary = run_training(cfg, run_dir=hc.runtime.output_dir)
    except (ConfigError, RunOutcome) as exc:
        if hc.mode == RunMode.MULTIRUN:
            raise  # the sweeper maps it to the trial's state, with this message
        if isinstance(exc, ConfigError):
            restore_after_refusal()  # what Hydra and the loggers wrote before the refusal
        end_with_one_line(exc)
    return objective_value(summary, cfg.objective)


def end_with_one_line(exc: Exception) -> None:
    """A single run that cannot go on ends with one line and a status that says why:
    2 a setting, 128 + signal number a preemption (the checkpoint is saved), 1 otherwise."""
    from app.core.outcomes import Preempted

    if isinstance(exc, Preempted):
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
        sys.exit(128 + exc.signum)
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(2 if isinstance(exc, ConfigError) else 1)


def cli() -> None:
    preflight(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
