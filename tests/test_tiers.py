"""The tiers' rule (tests/tiers.py): outside e2e no program starts, and every test has a tier."""

from __future__ import annotations

import multiprocessing
import subprocess

import pytest

from tests.tiers import ProcessInFastTier, check_tiers, programs_refused, tier_of

pytestmark = pytest.mark.unit


class Item:
    """What the rule reads of a collected test: its id and its marks."""

    def __init__(self, *marks: str, nodeid: str = "tests/test_x.py::test_y") -> None:
        self.marks, self.nodeid = set(marks), nodeid

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name in self.marks else None


@pytest.mark.parametrize("tier", ["unit", "integration"])
def test_a_fast_tier_test_that_starts_a_program_fails_naming_itself(tier, monkeypatch):
    monkeypatch.delenv("TIERS_RECORD", raising=False)  # the rule as it stands, not its survey
    with programs_refused(Item(tier)):  # type: ignore[arg-type]
        with pytest.raises(ProcessInFastTier, match=r"tests/test_x.py::test_y starts a program"):
            subprocess.run(["true"], check=False)
        with pytest.raises(ProcessInFastTier, match="not marked e2e"):
            ctx = multiprocessing.get_context("spawn")
            ctx.Process(target=print).start()


@pytest.mark.e2e
def test_an_e2e_test_may_start_programs():
    with programs_refused(Item("e2e")):  # type: ignore[arg-type]
        assert subprocess.run(["true"], check=False).returncode == 0


def test_the_strongest_mark_is_the_tier():
    assert tier_of(Item("unit", "e2e")) == "e2e"  # type: ignore[arg-type]
    assert tier_of(Item("integration", "unit")) == "integration"  # type: ignore[arg-type]
    assert tier_of(Item("slow")) is None  # type: ignore[arg-type]


def test_a_test_file_without_a_tier_stops_the_collection():
    with pytest.raises(pytest.UsageError, match=r"no tier for tests/test_new.py"):
        check_tiers([Item("slow", nodeid="tests/test_new.py::test_a")])  # type: ignore[list-item]
    check_tiers([Item("unit")])  # type: ignore[list-item]
