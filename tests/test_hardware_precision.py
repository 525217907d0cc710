"""Device presets and precision resolution, with fake devices standing in for real cards."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from app.components.hardware.devices import (
    DeviceInfo,
    detect_device,
    effective_preset,
    load_presets,
    match_preset,
)
from app.components.hardware.precision import resolve_precision
from app.config import ConfigError, GpuConfig

pytestmark = pytest.mark.unit


def _cuda(name: str, cc: tuple[int, int], preset: str) -> DeviceInfo:
    presets = load_presets()
    return DeviceInfo(
        "cuda",
        name,
        compute_capability=cc,
        preset=preset,
        peak_tflops=dict(presets[preset].peak_tflops) if preset in presets else {},
    )


@pytest.mark.parametrize(
    ("device_name", "preset"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100_pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100_40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100_80gb"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("Tesla T4", "t4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
    ],
)
def test_detected_names_match_their_preset(device_name, preset):
    assert match_preset(device_name, load_presets()).name == preset


def test_unknown_card_matches_nothing():
    assert match_preset("Some Future GPU", load_presets()) is None


def test_presets_cover_the_cards_users_have():
    expected = {
        "t4",
        "v100",
        "l4",
        "a30",
        "a100_40gb",
        "a100_80gb",
        "rtx3090",
        "rtx4090",
        "rtx5090",
        "l40s",
        "h100_pcie",
        "h100",
        "h200",
    }
    assert expected <= load_presets().keys()


def test_auto_on_ampere_is_bf16_without_scaler():
    dev = _cuda("NVIDIA A100-SXM4-80GB", (8, 0), "a100_80gb")
    plan = resolve_precision("auto", dev, load_presets()["a100_80gb"])
    assert plan.name == "bf16" and plan.autocast_dtype == torch.bfloat16
    assert not plan.use_grad_scaler and plan.tf32 and "A100" in plan.reason


def test_auto_on_t4_falls_back_to_fp16_with_scaler():
    dev = _cuda("Tesla T4", (7, 5), "t4")
    plan = resolve_precision("auto", dev, load_presets()["t4"])
    assert plan.name == "fp16" and plan.use_grad_scaler and not plan.tf32


@pytest.mark.parametrize("requested", ["bf16", "tf32"])
def test_bf16_and_tf32_on_turing_are_clear_errors(requested):
    dev = _cuda("Tesla T4", (7, 5), "t4")
    with pytest.raises(ConfigError, match=f"precision={requested} needs compute capability >= 8.0"):
        resolve_precision(requested, dev, load_presets()["t4"])


def test_generic_card_uses_its_capability():
    dev = DeviceInfo("cuda", "Future GPU", compute_capability=(10, 0), preset="generic-cuda")
    preset = effective_preset(OmegaConf.structured(GpuConfig(name="auto", device_type="auto")), dev)
    assert resolve_precision("auto", dev, preset).name == "bf16"


@pytest.mark.parametrize(
    ("requested", "name"), [("auto", "fp32"), ("fp32", "fp32"), ("bf16", "bf16")]
)
def test_cpu_precision(requested, name):
    plan = resolve_precision(requested, DeviceInfo("cpu", "cpu"), None)
    assert plan.name == name and not plan.use_grad_scaler and not plan.tf32


@pytest.mark.parametrize("requested", ["fp16", "tf32"])
def test_cuda_only_precisions_on_cpu_are_errors(requested):
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        resolve_precision(requested, DeviceInfo("cpu", "cpu"), None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_cuda_preset_without_cuda_points_to_cpu_or_auto():
    with pytest.raises(ConfigError, match=r"gpu=rtx4090 needs a CUDA device.*gpu=cpu or gpu=auto"):
        detect_device(load_presets()["rtx4090"])
    assert detect_device(OmegaConf.structured(GpuConfig(name="auto", device_type="auto"))).type == (
        "cpu"
    )


@pytest.mark.gpu
def test_auto_detects_the_real_card():
    dev = detect_device(OmegaConf.structured(GpuConfig(name="auto", device_type="auto")))
    assert dev.type == "cuda" and dev.total_memory_bytes > 0 and dev.compute_capability
