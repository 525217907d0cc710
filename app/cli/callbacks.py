"""The Hydra callback of a single run (conf/train.yaml: hydra.callbacks.start_checks).

Hydra calls `on_run_start` once it has composed the job and before it creates or writes the run
directory. Every check that needs no training runs there: the config's own (typed, as the run
will see it), then the machine's and the files' (app/engine/start_checks.py), with the run
directory Hydra is about to use. A refusal is one `error:` line and exit status 2, and the
directory is left byte for byte as it was. A start that passes records the directory, so a
refusal that can only come later (data that lacks a column, a tracker that cannot start) puts
back what Hydra and the loggers wrote (app/core/run_dir_guard.py).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, open_dict

from app.config.schema import TrainConfig, load_config
from app.core import run_dir_guard
from app.core.errors import ConfigError, fail


class StartChecks(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        job = copy.deepcopy(config)  # Hydra goes on with its own
        with open_dict(job):
            del job["hydra"]
        try:
            check_machine(load_config(job), run_dir)
        except ConfigError as exc:
            fail(str(exc))
        run_dir_guard.arm(run_dir)


def check_machine(config: TrainConfig, run_dir: Path) -> None:
    """The start checks on the device this run will use, found without creating a CUDA context
    (NVML): torch is imported only when there is a card to ask about."""
    from app.components.hardware.memory import (
        cuda_device_count_without_context,
        cuda_total_memory_without_context,
    )
    from app.engine.start_checks import AlreadyComplete, check_start

    wants = config.gpu.device_type
    on_cuda = wants == "cuda" or (wants == "auto" and cuda_device_count_without_context() > 0)
    if on_cuda:
        import torch  # the run's own test for a device, so both agree

        if not torch.cuda.is_available():
            if wants == "cuda":
                raise ConfigError(
                    f"gpu={config.gpu.name} needs a CUDA device but torch sees none "
                    "(torch.cuda.is_available() is False); use gpu=cpu or gpu=auto"
                )
            on_cuda = False
    total = cuda_total_memory_without_context() if on_cuda else None
    try:
        check_start(config, run_dir, "cuda" if on_cuda else "cpu", total)
    except AlreadyComplete as done:
        print(f"done       {done}", flush=True)
        sys.exit(0)
