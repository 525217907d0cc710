"""Which columns labelled rows must have, named by the settings that name them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.components.data.config import DataConfig


def text_columns(data: DataConfig) -> list[tuple[str, str]]:
    """(setting, column) pairs of the texts: the text, and the second text of a pair."""
    wanted = [("data.text_column", data.text_column)]
    if data.text_pair_column:
        wanted.append(("data.text_pair_column", data.text_pair_column))
    return wanted


def wanted_columns(data: DataConfig) -> list[tuple[str, str]]:
    """(setting, column) pairs a labelled row must have."""
    return [*text_columns(data), ("data.label_column", data.label_column)]
