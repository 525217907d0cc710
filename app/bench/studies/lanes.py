"""A bench's runs side by side, one per CPU core (`--cores 0,1`), each pinned to its core.

A free core takes the first task not started whose `after` task has finished; without cores the
tasks run one by one, in order. The first failure stops the rest from starting (a run already
going finishes) and is raised once every core is idle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Task(Generic[T]):
    run: Callable[[int | None], T]  # given the core to pin its process to (None: any)
    after: str | None = None  # the task whose result it needs


def run_on_cores(tasks: Mapping[str, Task[T]], cores: list[int] | None) -> dict[str, T]:
    unknown = {t.after for t in tasks.values()} - {None, *tasks}
    if unknown:
        raise ValueError(f"tasks wait for tasks that are not there: {sorted(map(str, unknown))}")
    cond = threading.Condition()
    started: set[str] = set()
    results: dict[str, T] = {}
    errors: list[BaseException] = []

    def next_task() -> str | None:
        with cond:
            while not errors:
                waiting = [n for n in tasks if n not in started]
                ready = [n for n in waiting if tasks[n].after in (None, *results)]
                if ready:
                    started.add(ready[0])
                    return ready[0]
                if not waiting:
                    return None
                cond.wait()
            return None

    def lane(core: int | None) -> None:
        while (name := next_task()) is not None:
            try:
                result = tasks[name].run(core)
            except BaseException as e:  # a failed run's SystemExit included
                with cond:
                    errors.append(e)
                    cond.notify_all()
                return
            with cond:
                results[name] = result
                cond.notify_all()

    lanes: list[int | None] = list(cores) if cores else [None]
    threads = [threading.Thread(target=lane, args=(c,)) for c in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
