"""The sinks every run has: TensorBoard events and metrics.jsonl in the run directory."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path

import yaml

from app.components.tracking.base import Sink

SAMPLES_SEEN = "data/samples_seen"
# Charted a second time against the samples seen (TensorBoard's x axis is the step): runs of
# different batch sizes line up at equal data there.
BY_DATA = ("val/", "train/loss")


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)
        seen = values.get(SAMPLES_SEEN)
        if seen is None:
            return
        for key, value in values.items():
            if key.startswith(BY_DATA):
                self._writer.add_scalar(f"by_samples/{key}", value, int(seen))

    def text(self, tag: str, text: str) -> None:
        self._writer.add_text(tag, text, 0)

    def config(self, config: Mapping[str, object], plan: Mapping[str, object]) -> None:
        # Indented by four spaces: TensorBoard renders text as Markdown, this as a code block.
        dump = yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False)
        self._writer.add_text("run/config", "\n".join("    " + ln for ln in dump.splitlines()), 0)

    def close(self, summary: Mapping[str, object] | None) -> None:
        self._writer.close()


class JsonlSink(Sink):
    """One JSON object per logged step, line-buffered so a killed run keeps what it logged."""

    name = "metrics.jsonl"

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **values}) + "\n")

    def close(self, summary: Mapping[str, object] | None) -> None:
        with contextlib.suppress(OSError):
            self._file.close()


def default_sinks(run_dir: Path) -> list[Sink]:
    return [TensorBoardSink(run_dir / "tensorboard"), JsonlSink(run_dir / "metrics.jsonl")]
