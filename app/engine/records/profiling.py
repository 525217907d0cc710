"""A torch.profiler window over a few optimizer steps: `training.profiler.steps=N`.

The trace lands in `<run dir>/tensorboard/profile/` as `rank<R>.<time>.pt.trace.json` (Chrome
trace format: Perfetto and chrome://tracing open it; so does TensorBoard's profiler plugin,
torch-tb-profiler, pointed at the run dir). Recording slows the steps it covers several-fold,
so the loop keeps them out of the throughput figures (app/engine/train/loop.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from app.config.training import ProfilerConfig
from app.engine.records.summary import ProfileWindow

TRACE_DIR = Path("tensorboard") / "profile"


class StepProfiler:
    """Records optimizer steps [start_step, start_step + steps) of this process, cut at the
    run's last step and, for a run resumed inside the window, started at its first step (so the
    summary names the steps really recorded)."""

    def __init__(
        self,
        cfg: ProfilerConfig,
        run_dir: Path,
        device: torch.device,
        max_steps: int,
        rank: int = 0,
        resumed_at: int = 0,
    ):
        wanted = int(cfg.start_step)
        self.end = min(wanted + int(cfg.steps), max_steps) if cfg.steps else wanted
        self.first = max(wanted, resumed_at)
        self.cfg = cfg
        self.trace_dir = run_dir / TRACE_DIR
        self.device = device
        self.rank = rank
        self._prof: torch.profiler.profile | None = None

    def covers(self, step: int) -> bool:
        return self.first <= step < self.end

    def before_step(self, step: int) -> None:
        if step == self.first and self.covers(step):
            self._prof = self._profile()
            self._prof.start()

    def after_step(self, step: int) -> None:
        if self._prof is not None and step == self.end - 1:
            self.close()

    def close(self) -> None:
        """Stop and write the trace (also when the run ends inside the window)."""
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()

    def describe(self) -> ProfileWindow:
        return {"steps": [self.first, self.end], "trace_dir": str(self.trace_dir)}

    def _profile(self) -> torch.profiler.profile:
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        return profile(
            activities=activities,
            record_shapes=self.cfg.record_shapes,
            profile_memory=self.cfg.profile_memory,
            with_stack=self.cfg.with_stack,
            on_trace_ready=tensorboard_trace_handler(
                str(self.trace_dir), worker_name=f"rank{self.rank}"
            ),
        )
