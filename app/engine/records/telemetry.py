"""Everything a run reports: TensorBoard, metrics.jsonl, summary.json, NVML, throughput and MFU.

NVML is sampled by a background thread about once a second, so reading GPU utilization, power
and temperature never sits on the training hot path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from app.components.tracking.base import Sink
from app.components.tracking.local import default_sinks
from app.core.atomic import atomic_write_text
from app.core.json_types import Json

log = logging.getLogger(__name__)


def flops_per_token(num_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token: 6N for the matmuls with weights (forward + backward) plus
    12 * L * H * Q * T for attention scores and values (PaLM appendix B, as in nanoGPT)."""
    return 6 * num_params + 12 * n_layer * n_head * head_dim * seq_len


def mfu(tokens_per_sec: float, flops_per_tok: int, peak_tflops: float | None) -> float | None:
    """Achieved FLOP/s over the dense peak; None when the device's peak is unknown."""
    if not peak_tflops:
        return None
    return tokens_per_sec * flops_per_tok / (peak_tflops * 1e12)


def write_json_atomic(path: Path, payload: Mapping[str, object]) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


class NvmlSampler:
    """Samples utilization, memory, power and temperature of one GPU in a daemon thread."""

    def __init__(self, index: int, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.latest: dict[str, float] = {}
        self._stop = threading.Event()
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # no NVML: the rest of the telemetry still works
            log.info("NVML unavailable (%s): no GPU utilization/power/temperature", exc)
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)

    def start(self) -> NvmlSampler:
        if self._handle is not None:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.latest = self.sample()

    def sample(self) -> dict[str, float]:
        nv, h = self._nvml, self._handle
        out: dict[str, float] = {}
        try:
            out["system/gpu_utilization_pct"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            out["system/gpu_memory_used_mb"] = nv.nvmlDeviceGetMemoryInfo(h).used / 2**20
            out["system/gpu_power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            out["system/gpu_temperature_c"] = float(
                nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            )
        except Exception:  # a field some boards do not report
            pass
        return out

    def stop(self) -> None:
        self._stop.set()


def cuda_memory_metrics(device: torch.device) -> dict[str, float]:
    stats = torch.cuda.memory_stats(device)
    return {
        "system/gpu_memory_allocated_mb": stats.get("allocated_bytes.all.current", 0) / 2**20,
        "system/gpu_memory_reserved_mb": stats.get("reserved_bytes.all.current", 0) / 2**20,
        "system/gpu_memory_max_allocated_mb": stats.get("allocated_bytes.all.peak", 0) / 2**20,
        "system/gpu_memory_max_reserved_mb": stats.get("reserved_bytes.all.peak", 0) / 2**20,
        "system/gpu_alloc_retries": float(stats.get("num_alloc_retries", 0)),
        "system/gpu_ooms": float(stats.get("num_ooms", 0)),
    }


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _process_peak_rss()


def _process_peak_rss() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


class RunLogger:
    """One place that writes scalars, on the main rank only; it fans them out to sinks
    (app/components/tracking/): TensorBoard and metrics.jsonl, and W&B or MLflow when configured.

    A sink that fails (a full disk, a tracker's server gone) is dropped with one error line and
    the run goes on: losing a log is better than losing the training.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool = True,
        nvml_index: int | None = None,
        sinks: list[Sink] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.nvml = NvmlSampler(nvml_index).start() if nvml_index is not None else None
        self.sinks: list[Sink] = []
        if enabled:
            self.sinks = sinks if sinks is not None else default_sinks(run_dir)

    def log(self, step: int, metrics: Mapping[str, float | None]) -> None:
        if not self.enabled:
            return
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        if self.nvml is not None:
            values.update(self.nvml.latest)
        self._each(lambda sink: sink.scalars(step, values))

    def text(self, tag: str, text: str) -> None:
        self._each(lambda sink: sink.text(tag, text))

    def config(self, config: dict[str, object], plan: dict[str, object]) -> None:
        self._each(lambda sink: sink.config(config, plan))

    def close(self, summary: dict[str, Json] | None = None) -> None:
        if self.nvml is not None:
            self.nvml.stop()
        self._each(lambda sink: sink.close(summary), closing=True)
        self.sinks = []

    def _each(self, call: Callable[[Sink], None], closing: bool = False) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as exc:
                log.error("%s is no longer written: %s", sink.name, exc)
                self.sinks.remove(sink)
                if not closing:
                    with contextlib.suppress(Exception):
                        sink.close(None)
