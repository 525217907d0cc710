from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from app.components.hardware.devices import PRESET_DIR, DeviceInfo, load_presets
from app.components.models.shape import model_shape
from app.config.budget import budget_of
from app.config.training import TrainingConfig
from app.engine.comms.distributed import DistInfo
from app.engine.records.summary import Summary
from app.engine.records.telemetry import flops_per_token, mfu
from app.engine.train.metering import Throughput, Window, log_window
from tests import procs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

# Dense (no 2:4 sparsity) bf16 tensor-core TFLOP/s from the vendor data sheets; fp16 is the same
# on these cards and TF32 is half. T4 and V100 have fp16 tensor cores only.
DENSE_BF16 = {
    "h100": 989,
    "h100_pcie": 756,
    "h200": 989,
    "a100_40gb": 312,
    "a100_80gb": 312,
    "a30": 165,
    "l40s": 362,
    "l4": 121,
    "rtx5090": 209.5,
    "rtx4090": 165.2,
    "rtx3090": 71,
}
FP16_ONLY = {"t4": 65, "v100": 125}


def test_every_cuda_preset_is_pinned() -> None:
    assert set(load_presets()) == set(DENSE_BF16) | set(FP16_ONLY)


@pytest.mark.parametrize("name", sorted(DENSE_BF16))
def test_dense_peak_ampere_and_newer(name: str) -> None:
    peak = OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml").peak_tflops)
    bf16 = DENSE_BF16[name]
    assert peak == {"bf16": bf16, "fp16": bf16, "tf32": bf16 / 2}


@pytest.mark.parametrize("name", sorted(FP16_ONLY))
def test_dense_peak_fp16_only_cards(name: str) -> None:
    preset = OmegaConf.load(PRESET_DIR / f"{name}.yaml")
    assert OmegaConf.to_container(preset.peak_tflops) == {"fp16": FP16_ONLY[name]}
    assert not preset.bf16 and not preset.tf32


def test_cpu_preset_has_no_peak() -> None:
    assert not OmegaConf.load(PRESET_DIR / "cpu.yaml").get("peak_tflops")


def gpt2_small_on_meta() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    # The conf/model/gpt2_small.yaml shape; the meta device allocates no weights.
    config = GPT2Config(vocab_size=50304, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def test_flops_per_token_gpt2_small_by_hand() -> None:
    shape = model_shape(gpt2_small_on_meta())
    d, v = 768, 50304
    ln_1 = ln_2 = 2 * d
    c_attn = d * 3 * d + 3 * d
    attn_proj = d * d + d
    c_fc = d * 4 * d + 4 * d
    mlp_proj = 4 * d * d + d
    per_layer = ln_1 + c_attn + attn_proj + ln_2 + c_fc + mlp_proj
    # Token embeddings (tied with the LM head: counted once), 12 blocks, final norm; the 1024
    # learned positions are excluded: a lookup, no matmul.
    n = v * d + 12 * per_layer + 2 * d
    assert n == 123_689_472
    assert (shape.num_params, shape.n_layer, shape.n_head, shape.head_dim) == (n, 12, 12, 64)
    expected = 6 * n + 12 * 12 * 12 * 64 * 1024
    assert expected == 855_383_040
    assert flops_per_token(n, 12, 12, 64, 1024) == expected


def test_mfu_against_the_dense_peak() -> None:
    # 100k tokens/s x 855 MFLOP/token = 85.5 TFLOP/s = 8.65% of an H100 SXM's 989.
    assert mfu(100_000, 855_383_040, 989) == pytest.approx(85.538304e12 / 989e12)


def test_mfu_is_none_for_cpu_and_unknown_devices() -> None:
    assert mfu(1e6, 10**9, None) is None
    cpu = DeviceInfo(type="cpu", name="some cpu")
    assert mfu(1e6, 10**9, cpu.peak_tflops.get("fp32")) is None
    unknown = DeviceInfo(type="cuda", name="Mystery GPU", preset="generic-cuda")
    assert mfu(1e6, 10**9, unknown.peak_tflops.get("bf16")) is None


# ---------------------------------------------------------------------------------------------
# Throughput


class FakeClock:
    """Host seconds that move only when a test says: timings without the machine's speed."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_throughput_excludes_pauses_and_the_first_window() -> None:
    clock = FakeClock()
    meter = Throughput(clock=clock)
    clock.advance(0.05)  # warm-up window: excluded from the steady figure
    meter.close_window(1000)
    with meter.pause():
        clock.advance(0.2)  # an eval: not training time
    clock.advance(0.05)
    assert meter.close_window(1000) == pytest.approx(0.05)
    assert meter.steady_tokens_per_sec() == pytest.approx(1000 / 0.05)
    assert meter.training_seconds() == pytest.approx(0.1)


def test_throughput_step_marks_on_cpu() -> None:
    clock = FakeClock()
    meter = Throughput(torch.device("cpu"), clock=clock)
    for seconds, pause_after in ((0.02, False), (0.03, True), (0.04, False)):
        clock.advance(seconds)
        meter.mark_step()
        if pause_after:
            with meter.pause():
                clock.advance(0.2)  # not part of the next step's time
    meter.close_window(3)
    assert meter.step_times == pytest.approx([0.02, 0.03, 0.04])
    assert meter.device_seconds == pytest.approx(0.09)
    # The next window starts timing from where this one closed.
    clock.advance(0.01)
    meter.mark_step()
    meter.close_window(1)
    assert meter.step_times == pytest.approx([0.01])


def test_throughput_device_is_adopted_at_the_first_log_point() -> None:
    clock = FakeClock()
    meter = Throughput(clock=clock)  # as train() builds it: marks start at the first window
    meter.close_window(1, torch.device("cpu"))
    assert meter.device_seconds is None
    clock.advance(0.5)
    meter.mark_step()
    meter.close_window(1, torch.device("cpu"))
    assert meter.device_seconds == pytest.approx(0.5) and meter.step_times == pytest.approx([0.5])


class RecordingLogger:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, step: int, metrics: dict) -> None:
        self.rows.append({"step": step, **metrics})


def fake_run(logger: RecordingLogger) -> SimpleNamespace:
    return SimpleNamespace(
        optimizer=SimpleNamespace(param_groups=[{"lr": 1e-3}]),
        plan=SimpleNamespace(effective_batch_size=4, micro_batch_size=2, grad_accum_steps=2),
        device=torch.device("cpu"),
        observers=SimpleNamespace(logger=logger),
        facts=SimpleNamespace(flops_per_token=1000, peak_tflops=None),  # CPU: no peak
        dist=DistInfo(),
        budget=budget_of(TrainingConfig(effective_batch_size=4), None),
        noise=None,
    )


def test_log_window_on_cpu_reports_rss_and_no_mfu() -> None:
    logger = RecordingLogger()
    window = Window(torch.tensor(20.0), units=10, tokens=256, steps=2, grad_norm=torch.tensor(0.5))
    summary = Summary()
    clock = FakeClock()
    meter = Throughput(clock=clock)
    clock.advance(0.5)
    log_window(fake_run(logger), 2, window, meter, summary, None)
    row = logger.rows[-1]
    assert row["step"] == 2 and row["train/loss"] == pytest.approx(2.0)
    assert row["train/mfu"] is None
    assert row["system/peak_rss_mb"] > 10
    assert row["train/tokens_per_sec"] == pytest.approx(256 / 0.5)
    assert row["train/grad_norm"] == pytest.approx(0.5)
    assert row["data/samples_seen"] == 8  # 2 steps of 4
    assert summary.final_train_loss == pytest.approx(2.0)
    assert window.steps == 0 and float(window.loss) == 0.0


IMPORTS_AT_EXIT = """
import atexit, runpy, sys
atexit.register(lambda: print("loaded:", *sorted(m for m in ("torch", "transformers")
                                              if m in sys.modules), file=sys.stderr))
sys.argv = ["app.train", *sys.argv[1:]]
runpy.run_module("app.train", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--cfg", "job"],
        # every registry read while the config is checked: optimizers, tasks, model families,
        # data sources, trackers
        ["--cfg", "job", "experiment=nli_tiny", "training.optimizer=adafactor"],
        ["--help"],
    ],
)
@pytest.mark.e2e
def test_printing_the_config_loads_neither_torch_nor_transformers(args) -> None:
    """What makes `--cfg job` and `--help` answer at once (docs/benchmarks.md, start-up):
    composing and checking the config imports no torch, no transformers."""
    proc = procs.run([procs.PY, "-c", IMPORTS_AT_EXIT, *args])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "loaded:", proc.stderr
