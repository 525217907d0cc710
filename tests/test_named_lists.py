"""No doc, comment or test types out the names of a kind the project finds by name (a registry's
components, a conf/ group's files): a list is read from the registry (tests/kinds.py), and prose
names a few examples. A list typed out is wrong the day a component is added, and sends the
one who adds it through every file that holds one."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from tests.kinds import ROOT, kinds

pytestmark = pytest.mark.unit

# Lists of kinds that code fixes rather than a module or a file adds: precision's names are
# the resolution's own branches (app/components/hardware/precision.py).
FIXED = {"conf/precision"}
# Measured records name what was measured; the benchmarks pick their arms by name.
RECORDS = ("docs/benchmarks.md", "app/bench/")
# Names this far apart (characters between them) are not one list: a paragraph that says
# something about each (`adamw` (the default), `lion` (one moment of state ...)) is prose.
LIST_GAP = 24


Match = tuple[int, int, str]  # (start, end, the name) of a name found in a text


@functools.cache
def _names_in(names: tuple[str, ...]) -> re.Pattern[str]:
    """Any of `names` as a word (the longest first: h100_pcie before h100), its `_` or `-`
    written either way or as a space (successive halving)."""
    words = (r"[_ -]".join(re.escape(p) for p in re.split(r"[_-]", n)) for n in names)
    alternatives = sorted(words, key=len, reverse=True)
    return re.compile(r"(?<![\w-])(?:" + "|".join(alternatives) + r")(?![\w-])")


def found_in(text: str, names: tuple[str, ...]) -> list[Match]:
    spelled = {re.sub(r"[_ -]", "_", n): n for n in names}
    return [
        (m.start(), m.end(), spelled[re.sub(r"[_ -]", "_", m.group(0))])
        for m in _names_in(names).finditer(text)
    ]


def longest_run(found: list[Match], kind: set[str], gap: int = LIST_GAP) -> list[str]:
    """The most distinct names of `kind` that run together in `found` (each within `gap` of
    the next)."""
    best: list[str] = []
    run: list[str] = []
    end = -gap - 1
    for start, stop, name in (f for f in found if f[2] in kind):
        run = [*run, name] if start - end <= gap else [name]
        end = stop
        if len(set(run)) > len(best):
            best = sorted(set(run))
    return best


def windows(path: Path) -> list[tuple[int, str, str]]:
    """(line number, the line, text to look in): a table row alone, otherwise the line and the
    two after it joined (a list wraps), comment marks and indentation dropped."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|"):
            out.append((i + 1, line, line))
            continue
        near = [ln for ln in lines[i : i + 3] if not ln.lstrip().startswith("|")]
        out.append((i + 1, line, " ".join(ln.strip().lstrip("#").strip() for ln in near)))
    return out


def files(root: Path) -> list[Path]:
    patterns = ("README.md", "docs/*.md", "app/**/*.py", "hydra_plugins/**/*.py", "tests/**/*.py")
    found = [p for pattern in patterns for p in sorted(root.glob(pattern))]
    found += sorted(root.glob("conf/**/*.yaml")) + sorted(root.glob("sweeps/**/*.yaml"))
    return [p for p in found if not p.relative_to(root).as_posix().startswith(RECORDS)]


def typed_lists(root: Path, known: dict[str, tuple[str, ...]]) -> list[str]:
    """Places in the files under `root` that run together all of a kind's names, or all but
    one: every one that there were when it was written (the one added since is what it
    misses). Kinds of fewer than three names are too few to tell a list from two examples."""
    lists = {k: set(names) for k, names in known.items() if len(names) >= 3 and k not in FIXED}
    every = tuple(sorted(set().union(*lists.values())))
    found = []
    for path in files(root):
        text = path.read_text()
        in_file = {name for _, _, name in found_in(text, every)}
        for kind, names in lists.items():
            least = max(3, len(names) - 1)
            if len(in_file & names) >= least:
                where = path.relative_to(root).as_posix()
                found += [
                    f"{where}:{n}: {kind}: {', '.join(named)}"
                    for n, named in _lists_in(path, every, names, least)
                ]
    return found


def _lists_in(
    path: Path, every: tuple[str, ...], kind: set[str], least: int
) -> list[tuple[int, list[str]]]:
    """(line, the names) of each list of at least `least` names of `kind` that starts on that
    line."""
    out: list[tuple[int, list[str]]] = []
    for number, line, text in windows(path):
        named = longest_run(found_in(text, every), kind)
        if len(named) < least or not {n for _, _, n in found_in(line, every)} & set(named):
            continue
        if not out or out[-1][0] < number - 2:  # the same list, seen from the next line
            out.append((number, named))
    return out


def test_no_file_types_out_the_names_of_a_kind():
    found = typed_lists(ROOT, kinds())
    assert not found, "read the list from its registry, or name examples:\n" + "\n".join(found)


def test_a_list_is_names_run_together_and_one_added_since_still_counts(tmp_path):
    """What the check calls a list, on a small tree of its own: all names, or all but the one
    added since, run together; a paragraph that describes each is not a list."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "a tree (`silver_birch`, the default, `alder`,\n`cedar`)\n\n"
        "`alder` (grows by water and fixes nitrogen in its roots, so it feeds the soil it\n"
        "stands in), `cedar` (keeps its needles all winter and its wood smells of resin)\n"
        "or `silver_birch` (white bark that peels off in thin sheets)\n\n"
        "such as alder or cedar\n"
        "| `x` | `error: choose one of: alder, cedar, dogwood, silver_birch` |\n"
    )
    known = {"trees": ("alder", "cedar", "dogwood", "silver_birch")}
    assert typed_lists(tmp_path, known) == [
        "docs/a.md:1: trees: alder, cedar, silver_birch",
        "docs/a.md:9: trees: alder, cedar, dogwood, silver_birch",
    ]
