"""A bench's runs side by side (app/bench/studies/lanes.py): a task waits for the one it needs,
each core runs one at a time, and a failure stops what has not started."""

from __future__ import annotations

import threading
import time

import pytest

from app.bench.studies.lanes import Task, run_on_cores

pytestmark = pytest.mark.unit


class Clock:
    """Which task ran on which core, and which had finished when each started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished: list[str] = []
        self.starts: dict[str, tuple[int | None, list[str]]] = {}

    def task(self, name: str, seconds: float, after: str | None = None) -> Task[str]:
        def run(core: int | None) -> str:
            with self.lock:
                self.starts[name] = (core, list(self.finished))
            time.sleep(seconds)
            with self.lock:
                self.finished.append(name)
            return f"{name} on {core}"

        return Task(run, after)


def test_a_task_waits_for_the_one_it_needs_while_a_free_core_takes_the_next():
    c = Clock()
    tasks = {
        "long": c.task("long", 0.15),
        "needs long": c.task("needs long", 0.01, after="long"),
        "short": c.task("short", 0.01),
    }
    results = run_on_cores(tasks, [0, 1])
    assert c.starts["long"][0] != c.starts["short"][0]  # side by side
    assert "long" in c.starts["needs long"][1]  # not before its source ended
    assert "short" not in c.starts["long"][1] and "short" in c.starts["needs long"][1]
    assert set(results) == set(tasks) and results["long"].startswith("long on ")


def test_without_cores_the_tasks_run_one_by_one_in_order():
    c = Clock()
    tasks = {n: c.task(n, 0.0) for n in ("a", "b", "c")}
    assert run_on_cores(tasks, None) == {"a": "a on None", "b": "b on None", "c": "c on None"}
    assert c.finished == ["a", "b", "c"]


def test_a_failure_stops_what_has_not_started_and_is_raised():
    c = Clock()

    def fail(core: int | None) -> str:
        raise SystemExit("study failed")

    tasks = {"bad": Task(fail), "then": c.task("then", 0.0, after="bad"), "x": c.task("x", 0.0)}
    with pytest.raises(SystemExit, match="study failed"):
        run_on_cores(tasks, None)
    assert c.starts == {}
    with pytest.raises(ValueError, match="not there"):
        run_on_cores({"a": Task(fail, after="missing")}, None)
