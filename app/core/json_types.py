"""The values of a JSON document: what summary.json and a tracker's records hold."""

from __future__ import annotations

from typing import TypeAlias

Json: TypeAlias = str | int | float | bool | list["Json"] | dict[str, "Json"] | None
