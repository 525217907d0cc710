"""Every project path named in the code, the configs and the docs points at a file that exists:
a module moved or renamed takes its mentions with it (twelve once named modules long gone)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
TOP = ("app", "hydra_plugins", "conf", "sweeps", "tests", "docs", "scripts", "docker", ".ci")
# A path: a top-level folder, then name characters; `...` and `*` stand for any part (globbed),
# `<name>` for a value the reader supplies (not checked).
PATH = re.compile(r"(?<![\w/.\-])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w/.*<>\-]*)")


def _sources() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    found += sorted((ROOT / "docs").glob("*.md"))
    for top in ("app", "hydra_plugins", "conf", "sweeps", "docker", "scripts"):
        found += [
            p
            for p in sorted((ROOT / top).rglob("*"))
            if p.is_file() and p.suffix in (".py", ".yaml", ".sh", ".md", "")
        ]
    return found


def references(text: str) -> set[str]:
    out = set()
    for match in PATH.finditer(text):
        ref = match.group(1).rstrip(".,:;)`'\">")  # `>`: a kind, `<conf/model>` (tests/kinds.py)
        if "<" in ref:  # a template the reader fills in
            continue
        if ref.rstrip("/") not in TOP:
            out.add(ref)
    return out


def exists(ref: str) -> bool:
    pattern = ref.replace("...", "**")
    if "*" in pattern:
        return any(ROOT.glob(pattern.rstrip("/")))
    return (ROOT / ref).exists()


def test_every_project_path_named_in_code_configs_and_docs_exists():
    missing = {
        f"{path.relative_to(ROOT)}: {ref}"
        for path in _sources()
        for ref in references(path.read_text(errors="ignore"))
        if not exists(ref)
    }
    assert not missing, sorted(missing)


def test_the_reference_check_finds_a_moved_module():
    assert references("see app/data/sources.py and hydra_plugins/.../_asha.py") == {
        "app/data/sources.py",
        "hydra_plugins/.../_asha.py",
    }
    assert not exists("app/data/sources.py")  # moved to app/components/data/sources/
    assert exists("hydra_plugins/.../_asha.py") and exists("sweeps/nli_*.yaml")
