"""docs/layout.md is the map a newcomer reads first: every path its tree names exists, every
room of app/ and of the sweeper is on it, and every file its "Extending" table sends a change
to is there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[\w./-]+(?:/|\.py))(?:\s{2,}(?P<text>.*))?$")
NAMED = re.compile(r"(?<![\w./-])(?P<name>[a-z_][\w]*(?:/|\.py))(?![\w/])")


def tree() -> dict[str, str]:
    """The tree block's entries as {path: what it says}: an entry indented two spaces more than
    the one above it lives inside it."""
    block = LAYOUT.read_text().split("```")[1]
    entries: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    last = ""
    for line in block.splitlines():
        m = ENTRY.match(line)
        if m is None:  # a description's continuation
            if last:
                entries[last] += " " + line.strip()
            continue
        indent = len(m["indent"])
        parents = [(i, p) for i, p in parents if i < indent]
        path = (parents[-1][1] if parents else "") + m["name"]
        entries[path] = m["text"] or ""
        if path.endswith("/"):
            parents.append((indent, path))
        last = path
    return entries


def extending_paths() -> list[str]:
    """The paths the "Extending" table sends a change to; a `<name>` one stands for its folder,
    and one that starts below the top (`tracking/config.py`) is looked up anywhere."""
    table = LAYOUT.read_text().split("## Extending")[1]
    found = []
    for p in re.findall(r"`([\w./<>*-]+)`", table):
        if "/" not in p:
            continue
        if "<" in p:
            p = p[: p.index("<")].rpartition("/")[0] + "/"
        found.append(p if p.split("/")[0] in TOPS else f"**/{p}")
    return found


TOPS = {"app", "hydra_plugins", "conf", "sweeps", "docker", "tests", "docs", "scripts"}


def test_every_path_the_tree_names_exists():
    missing = [p for p in tree() if not (ROOT / p).exists()]
    assert not missing, missing


def test_a_file_or_folder_a_tree_entry_mentions_is_inside_it():
    """`sources/ (builtin, ...)` in data/'s line: a folder or module somewhere under data/."""
    missing = []
    for path, text in tree().items():
        if not path.endswith("/"):
            continue
        for named in NAMED.findall(text):
            if not any((ROOT / path).rglob(named.rstrip("/"))):
                missing.append(f"{path}: {named}")
    assert not missing, missing


def test_every_room_of_the_app_and_the_sweeper_is_on_the_map():
    """Each folder of app/ (two levels down: app/engine/train/) and of the sweeper is an entry,
    or named in its parent's entry."""
    entries = tree()
    said = " ".join(entries.values())
    rooms = [
        f.relative_to(ROOT).as_posix() + "/"
        for base, depth in ((ROOT / "app", 2), (ROOT / "hydra_plugins", 2))
        for f in base.glob("/".join(["*"] * depth))
        if f.is_dir() and (f / "__init__.py").exists()
    ] + [
        f.relative_to(ROOT).as_posix() + "/"
        for f in (ROOT / "app").glob("*")
        if f.is_dir() and (f / "__init__.py").exists()
    ]
    missing = [r for r in rooms if r not in entries and Path(r).name + "/" not in said]
    assert not missing, missing


def test_every_file_the_extending_table_names_exists():
    paths = extending_paths()
    assert len(paths) >= 10  # the table is read: optimizers, tasks, pruners, samplers, ...
    missing = [p for p in paths if not any(ROOT.glob(p.rstrip("/")))]
    assert not missing, missing
