"""Every kind of thing the project finds by name, and its names as the project reads them: the
registries of app/ and of the sweeper, the samplers, the files of each conf/ group.

A test or a docs table that shows such a list reads it from here, so a component added (a
module, a config file) is named wherever a list is shown and no file types one out
(tests/test_named_lists.py holds the docs, comments and tests to that). A docs table writes a
list as `<kind>` (`<pruners>`, `<conf/model>`) and `fill` puts in the names, as the error line
prints them: sorted, comma-separated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
PLACEHOLDER = re.compile(r"<([\w./ ]+)>")


def _registries() -> dict[str, Callable[[], tuple[str, ...]]]:
    from app.components.data.sources import SOURCES
    from app.components.models.families import MODELS
    from app.components.optim import OPTIMIZERS
    from app.components.tasks import TASKS
    from app.components.tracking import TRACKERS
    from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import PRUNERS
    from hydra_plugins.hydratrain_optuna_sweeper._study._samplers import sampler_names

    return {
        "model families": MODELS.names,
        "tasks": TASKS.names,
        "optimizers": OPTIMIZERS.names,
        "data sources": SOURCES.names,
        "trackers": TRACKERS.names,
        "pruners": PRUNERS.names,
        "samplers": sampler_names,
        "optimizers that step shards": lambda: tuple(
            n for n in OPTIMIZERS.names() if OPTIMIZERS.get(n).steps_shards
        ),
    }


def conf_groups() -> list[str]:
    """The config groups users choose from: each folder of conf/."""
    return sorted(p.name for p in CONF.iterdir() if p.is_dir())


def kinds() -> dict[str, tuple[str, ...]]:
    """{kind: its names}: each registry's (and the samplers'), each conf/ group's files as
    `conf/<group>`."""
    found = {kind: names() for kind, names in _registries().items()}
    for group in conf_groups():
        found[f"conf/{group}"] = tuple(sorted(p.stem for p in (CONF / group).glob("*.yaml")))
    return found


def fill(text: str) -> str:
    """`text` with each `<kind>` replaced by that kind's names, comma-separated (`<dir>` and
    any other word in angle brackets left as it is)."""
    known = kinds()

    def names(m: re.Match[str]) -> str:
        return ", ".join(known[m.group(1)]) if m.group(1) in known else m.group(0)

    return PLACEHOLDER.sub(names, text)
