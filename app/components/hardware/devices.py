"""Find the device this run trains on and the preset that describes it.

NVML gives the card's name and memory without creating a CUDA context; torch gives the compute
capability and the memory this process can actually use (below the label: an "80 GB" H100 shows
about 79 GiB).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf

from app.components.hardware.config import GpuConfig
from app.components.hardware.memory import nvml_name_and_memory
from app.core.errors import ConfigError

log = logging.getLogger(__name__)
PRESET_DIR = Path(__file__).resolve().parents[3] / "conf" / "gpu"


@dataclass
class DeviceInfo:
    type: str  # cuda | cpu
    name: str
    index: int = 0
    total_memory_bytes: int | None = None
    memory_limit_bytes: int | None = None  # gpu.memory_limit_gib, where it caps this process
    compute_capability: tuple[int, int] | None = None
    preset: str = "cpu"
    peak_tflops: dict[str, float] = field(default_factory=dict)  # empty: MFU unknown
    warnings: list[str] = field(default_factory=list)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.type == "cuda" else torch.device("cpu")

    @property
    def capability(self) -> float | None:
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return major + minor / 10


def load_preset(path: Path) -> GpuConfig:
    """One preset file of conf/gpu, typed by the schema."""
    node = OmegaConf.merge(OmegaConf.structured(GpuConfig), OmegaConf.load(path))
    preset = OmegaConf.to_object(node)
    assert isinstance(preset, GpuConfig)
    return preset


def load_presets() -> dict[str, GpuConfig]:
    """Every CUDA preset in conf/gpu: adding a card is adding a file there."""
    presets = [load_preset(path) for path in sorted(PRESET_DIR.glob("*.yaml"))]
    return {p.name: p for p in presets if p.device_type == "cuda"}


def match_preset(device_name: str, presets: dict[str, GpuConfig]) -> GpuConfig | None:
    """The preset whose longest `match` occurs in the device name ("H100 PCIe" beats "H100")."""
    best, best_len = None, 0
    lowered = device_name.lower()
    for preset in presets.values():
        for pattern in preset.match:
            if pattern.lower() in lowered and len(pattern) > best_len:
                best, best_len = preset, len(pattern)
    return best


def _local_cuda_index() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def detect_device(gpu: GpuConfig) -> DeviceInfo:
    """Resolve `gpu=...` against the machine; raise ConfigError for a preset that cannot apply."""
    wants = gpu.device_type
    if wants == "cpu" or (wants == "auto" and not torch.cuda.is_available()):
        info = DeviceInfo(type="cpu", name=_cpu_name(), preset="cpu")
        if gpu.memory_limit_gib is not None:
            info.warnings.append("gpu.memory_limit_gib caps a CUDA device: the CPU is not capped")
        return info
    if not torch.cuda.is_available():
        raise ConfigError(
            f"gpu={gpu.name} needs a CUDA device but torch sees none "
            "(torch.cuda.is_available() is False); use gpu=cpu or gpu=auto"
        )
    return _detect_cuda(gpu)


def _detect_cuda(gpu: GpuConfig) -> DeviceInfo:
    index = _local_cuda_index()
    torch.cuda.set_device(index)
    nvml = nvml_name_and_memory(index)
    name = nvml[0] if nvml else torch.cuda.get_device_name(index)
    _, usable = torch.cuda.mem_get_info(index)
    total = torch.cuda.get_device_properties(index).total_memory
    info = DeviceInfo(
        type="cuda",
        name=name,
        index=index,
        total_memory_bytes=int(total),
        compute_capability=torch.cuda.get_device_capability(index),
    )
    detected = match_preset(name, load_presets())
    if gpu.device_type == "auto":
        info.preset = detected.name if detected else "generic-cuda"
        if detected is None:
            info.warnings.append(
                f"no preset matches '{name}': MFU is unknown, defaults are generic"
            )
    else:
        info.preset = gpu.name
        if detected is None or detected.name != gpu.name:
            info.warnings.append(
                f"gpu={gpu.name} does not match the detected '{name}' "
                f"({total / 2**30:.1f} GiB); trusting the detected memory"
            )
    info.peak_tflops = dict(detected.peak_tflops) if detected else {}
    if gpu.memory_limit_gib is not None:
        info.memory_limit_bytes = cap_process_memory(index, gpu.memory_limit_gib, int(total))
    log.debug("CUDA free memory at start: %.1f GiB", usable / 2**30)
    return info


def cap_process_memory(index: int, limit_gib: float, total_bytes: int) -> int:
    """Hold this process's CUDA allocator to `limit_gib` of the card (gpu.memory_limit_gib):
    past it an allocation raises torch's OutOfMemoryError in this process, whose run recovers
    or ends as on a full card, rather than taking memory a neighbour trial holds. The CUDA
    context itself lies outside the allocator: the preset's headroom covers it. Returns the
    cap in bytes."""
    limit = min(int(limit_gib * 2**30), total_bytes)
    torch.cuda.set_per_process_memory_fraction(limit / total_bytes, index)
    return limit


def effective_preset(gpu: GpuConfig, device: DeviceInfo) -> GpuConfig:
    """The settings that apply to this device: the named preset, or the detected one for auto."""
    if gpu.device_type != "auto" or device.type == "cpu":
        if device.type == "cpu" and gpu.device_type == "auto":
            return load_preset(PRESET_DIR / "cpu.yaml")
        return gpu
    presets = load_presets()
    if device.preset in presets:
        return presets[device.preset]
    cc = device.capability or 0.0
    return GpuConfig(name="generic-cuda", bf16=cc >= 8.0, tf32=cc >= 8.0, compute_capability=cc)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"
