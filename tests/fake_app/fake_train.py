"""A fake trainer with the real contract: reporter, outcomes, summary.json, return value,
SIGTERM/SIGINT preemption (finish the evaluation, write the summary, raise Preempted), and a
pause at a rung (hpo.pruner=asha: a "checkpoint" of the step, resumed by training.resume).

The loss curve is a deterministic function of the sampled lr, so tests can predict pruning.
Each job costs fake.device_s_per_step device-seconds per step it trains.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from app.config.hpo import HpoConfig
from app.core.outcomes import Diverged, Paused, Preempted, Pruned, TrainingOOM
from app.core.preemption import StopRequest, stop_on_signals
from app.hpo import TrialAttrs, build_reporter

_KEEP: list[bytearray] = []


@dataclass
class FakeConfig:
    """The root schema: like app/config.py's, it types the hpo group (the rest is free)."""

    model: Any = None
    data: Any = None
    training: Any = None
    fake: Any = None
    gpu: Any = None
    objective: Any = "final_val_loss"
    hpo: HpoConfig | None = None


ConfigStore.instance().store(name="fake_schema", node=FakeConfig)


def loss_at(step: int, lr: float) -> float:
    quality = abs(math.log10(lr) - math.log10(3e-3))  # 0 at the best lr
    return 2.0 + quality + 3.0 * math.exp(-step / 10)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | list[float]:
    t, f = cfg.training, cfg.fake
    hpo = cfg.get("hpo")
    reporter = build_reporter(hpo, cfg)
    if f.crash_at_trial is not None and hpo is not None and hpo.trial_number == f.crash_at_trial:
        time.sleep(f.step_sleep)
        os._exit(9)  # like kill -9: no tell, no cleanup
    if f.leak_mb:
        _KEEP.append(bytearray(int(f.leak_mb) * 2**20))
    if f.oom_above_batch is not None and t.effective_batch_size > f.oom_above_batch:
        raise TrainingOOM(f"fake OOM at effective batch {t.effective_batch_size}")
    if f.error_above_lr is not None and t.lr > f.error_above_lr:
        raise RuntimeError(f"fake error at lr {t.lr}")
    time.sleep(f.setup_sleep)  # a signal now reaches the sweeper's handler, not this run's
    stop = StopRequest()
    start = _resumed_step(t)
    paused = None
    with stop_on_signals(stop):
        _hold(f, hpo, stop)
        try:
            loss, step = _train(t, f, reporter, stop, start)
        except Paused as e:
            paused, loss, step = e, loss_at(e.step, t.lr), e.step
    run_dir = HydraConfig.get().runtime.output_dir
    status = "paused" if paused else "preempted" if stop.requested else "completed"
    summary = {
        "status": status,
        "steps": step,
        "resumed_from": t.get("resume"),
        "resumed_from_step": start,
        "final_val_loss": loss,
        "tokens_per_sec": 1000.0 * t.effective_batch_size,
        "device_seconds": f.device_s_per_step * (step - start),
        "micro_batch_size": t.micro_batch_size,
        "grad_accum_steps": 1,
        "effective_batch_size": t.effective_batch_size,
        "peak_memory_bytes": f.peak_memory_bytes,
        "memory_limit_gib": cfg.gpu.memory_limit_gib,  # the cap the sweep gave this trial
        "run_dir": run_dir,
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),  # as the trial's process saw them
        "batch_schedule": _grown(t.effective_batch_size, step, f.grow_batch),
    }
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    Path(run_dir, "summary.json").write_text(json.dumps(summary))
    known = set(TrialAttrs.__dataclass_fields__)
    reporter.set_attrs(TrialAttrs(**{k: v for k, v in summary.items() if k in known}))
    if paused is not None:
        Path(run_dir, "checkpoint.json").write_text(json.dumps({"step": step}))
        raise paused
    if stop.requested:
        raise Preempted(f"{stop.name}: stopped after step {step}", signum=stop.signum, step=step)
    metric = cfg.objective
    return summary[metric] if isinstance(metric, str) else [summary[m] for m in metric]


def _grown(batch: int, steps: int, grows: int | None) -> list[dict[str, int]] | None:
    """For a trial of batch `grows`: the phases of a batch doubled halfway through
    (training.batch_schedule=adaptive's record: the step and samples seen where each began)."""
    if batch != grows:
        return None
    half = steps // 2
    return [{"step": 0, "samples": 0, "batch": batch}, {"step": half, "samples": half * batch,
                                                        "batch": 2 * batch}]  # fmt: skip


def _hold(f, hpo, stop: StopRequest) -> None:
    """Trials numbered from fake.hold_from up to below fake.hold_below wait for
    fake.release_file (or a signal)."""
    if f.hold_below is None or hpo is None or not f.hold_from <= hpo.trial_number < f.hold_below:
        return
    Path(f"{f.release_file}.{hpo.trial_number}.holding").touch()  # SIGTERM is this run's now
    while not Path(f.release_file).exists() and not stop.requested:
        time.sleep(0.05)


def _resumed_step(t) -> int:
    """The step a paused run's "checkpoint" holds (0: a fresh run)."""
    resume = t.get("resume")
    saved = Path(str(resume), "checkpoint.json") if resume else None
    return int(json.loads(saved.read_text())["step"]) if saved and saved.is_file() else 0


def _train(t, f, reporter, stop: StopRequest, start: int = 0) -> tuple[float, int]:
    loss, step = float("nan"), start
    first = start + t.eval_every if start else 0  # a resumed run reported its step already
    for step in range(first, t.max_steps + 1, t.eval_every):
        time.sleep(f.step_sleep)
        loss = loss_at(step, t.lr)
        if f.diverge_above_lr is not None and t.lr > f.diverge_above_lr and step > 0:
            raise Diverged(f"validation loss is nan at step {step}")
        if reporter.report(step, {"val_loss": loss}):
            raise Pruned(f"pruned at step {step}")
        if stop.requested and step < t.max_steps:
            break
    return loss, step


if __name__ == "__main__":
    main()
