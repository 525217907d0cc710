"""Reads back what W&B wrote offline, for the tracking tests.

An offline run has no summary or history files: everything is in `run-<id>.wandb`, records of
W&B's protobuf `Record` (wandb.proto, shipped with the library) framed in the LevelDB log format
that `wandb sync` reads: a 7-byte file header, then 32 KiB blocks of chunks, each with a 7-byte
header (CRC32C, length, type: 1 full, 2 first, 3 middle, 4 last).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, LAST = 1, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if left < HEADER or (length == 0 and kind == 0):  # the block's zero padding
            pos += left
            continue
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _value(item: Any) -> tuple[str, Any]:
    key = item.key or "/".join(item.nested_key)
    return key, json.loads(item.value_json)


def history(path: Path) -> list[dict[str, Any]]:
    """One dict per logged step, as wandb.log() received them."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(dict(_value(i) for i in record.history.item))
    return rows


def config(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        updates = record.config.update if kind == "config" else []
        if kind == "run":
            updates = record.run.config.update
        out.update(_value(i) for i in updates)
    return out


def exit_code(path: Path) -> int | None:
    for record in records(path):
        if record.WhichOneof("record_type") == "exit":
            return record.exit.exit_code
    return None
