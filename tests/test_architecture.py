"""The shape of the code, checked: rooms of a readable size, arrows that point down, no circle,
and the typed config below the entry. What the architecture promises (docs/layout.md) holds,
for the app and for the sweeper (hydra_plugins/) alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "hydra_plugins")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def modules() -> dict[str, Path]:
    """Every module of app/ and hydra_plugins/ by its dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported(path: Path) -> set[str]:
    """The project's modules a file imports, anywhere in it (functions and TYPE_CHECKING too),
    relative imports resolved."""
    here = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = here.rpartition(".")[0]  # an __init__'s "." is its own package: the same
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return {n for n in names if n.split(".")[0] in PACKAGES}


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        return node.module or ""
    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join([*parent, *([node.module] if node.module else [])])


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {n for n in imported(p) if n in known and n != m} for m, p in known.items()}


def package_of(module: str) -> str:
    return module if module in PACKAGE_INITS else module.rpartition(".")[0]


PACKAGE_INITS = {m for m, p in modules().items() if p.name == "__init__.py"}


def test_modules_are_rooms_of_a_readable_size():
    big = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > 400}
    assert not big, big


MAX_FOLDER_MODULES = 12


def test_no_folder_is_a_flat_list_of_more_than_twelve_modules():
    """A folder past a dozen modules gets rooms (subpackages by what they are about)."""
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(ROOT / package).rglob("*/")]:
            names = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(names) > MAX_FOLDER_MODULES and "__pycache__" not in folder.parts:
                crowded[str(folder.relative_to(ROOT))] = len(names)
    assert not crowded, crowded


def room_of(module: str, folder: str) -> str | None:
    """The room of `folder` that holds `module`: its module or subpackage directly under it."""
    if not module.startswith(folder + "."):
        return None
    return module[len(folder) + 1 :].split(".")[0]


def test_the_rooms_of_every_folder_import_each_other_without_a_circle():
    """Inside each folder its modules and subfolders are rooms; an import between two of them is
    an arrow. A circle among rooms (a -> b -> a, module by module acyclic) is an arrow that runs
    back up: the batch search once imported the run that imported the batch plan."""
    g = graph()
    folders = {package_of(m) for m in g} | set(PACKAGE_INITS)
    circles = []
    for folder in sorted(folders):
        arrows: dict[str, set[str]] = {}
        for m, targets in g.items():
            a = room_of(m, folder)
            for n in targets:
                b = room_of(n, folder)
                if a and b and a != b:
                    arrows.setdefault(a, set()).add(b)
        circles += [f"{folder}: {c}" for c in _circles(arrows)]
    assert not circles, circles


def _circles(arrows: dict[str, set[str]]) -> list[str]:
    found, state = [], {}  # state 1: on the path, 2: done

    def visit(a: str, path: list[str]) -> None:
        state[a] = 1
        for b in sorted(arrows.get(a, ())):
            if state.get(b) == 1:
                found.append(" -> ".join([*path[path.index(b) :], b]))
            elif b not in state:
                visit(b, [*path, b])
        state[a] = 2

    for a in sorted(arrows):
        if a not in state:
            visit(a, [a])
    return found


def test_functions_fit_on_a_screen_outside_the_benchmark():
    long = []
    for name, path in modules().items():
        if name.startswith("app.bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert not long, long


def test_no_module_imports_itself_back():
    g = graph()
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(g[m]):
            if seen.get(n) == 1:
                cycle = [*path[path.index(n) :], n]
                pytest.fail(f"import circle: {' -> '.join(cycle)}")
            if n not in seen:
                visit(n, [*path, n])
        seen[m] = 2

    for m in sorted(g):
        if m not in seen:
            visit(m, [m])


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("app.core", ("app.components", "app.config", "app.engine", "app.cli", "app.hpo")),
        ("app.components", ("app.engine", "app.cli", "app.hpo", "app.train")),
        ("app.engine", ("app.cli", "app.train")),
        ("app.hpo", ("app.engine", "app.cli", "app.train")),
    ],
)
def test_arrows_point_down(layer, forbidden):
    """core <- components <- config <- hpo <- engine <- cli/train: no arrow runs back up."""
    up = [
        f"{m} -> {n}"
        for m, targets in graph().items()
        if m == layer or m.startswith(layer + ".")
        for n in targets
        if any(n == f or n.startswith(f + ".") for f in forbidden)
    ]
    assert not up, up


def test_the_engine_and_the_components_import_neither_hydra_nor_optuna():
    bad = []
    for name, path in modules().items():
        if not name.startswith(("app.engine", "app.components", "app.core")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            bad += [f"{name}: {m}" for m in mods if m.split(".")[0] in ("hydra", "optuna")]
    assert not bad, bad


def test_dictconfig_lives_only_in_the_entry_the_config_and_the_cli():
    allowed = ("app.train", "app.config", "app.cli")
    users = [
        name
        for name, path in modules().items()
        if name.startswith("app.")
        and "DictConfig" in path.read_text()
        and not name.startswith(allowed)
    ]
    assert not users, users


# What the sweeper may import of the app, each from its own home (no facade re-exports them):
SWEEPER_REACHES = (
    "app.hpo",  # the trial's contract: the reporter, the trial's attributes, the objectives
    "app.config.hpo",  # the study's settings, declared once (HpoConfig)
    "app.config.budget",  # the budget's unit and the axis a trial reports on
    "app.config.jobs",  # a composed job config: its task, its checks, where it reports
    "app.config.compose",  # a composition error as one line
    "app.studies",  # what a study writes: the report, the batch-size study
    "app.components.hardware.visible",  # the GPUs a fleet pins, without starting CUDA
    "app.components.hardware.sharing",  # the memory of a GPU its trials share
    "app.core",  # torch-free: errors, how a run ended, signals, masking, registries
)


def test_the_sweeper_reaches_the_app_through_the_trial_contract_and_torch_free_homes():
    """Never the engine, the models, data, optimizers or tasks a training run is built from,
    nor the cli or the entry; and app.hpo holds the trial's contract alone (it once re-exported
    31 names so that this test could say "app.hpo only")."""
    plugin = ROOT / "hydra_plugins"
    reached = {
        f"{path.relative_to(ROOT)}: {n}"
        for path in plugin.rglob("*.py")
        for n in imported(path)
        if n.startswith("app") and not any(n == a or n.startswith(f"{a}.") for a in SWEEPER_REACHES)
    }
    assert not reached, reached
    import app.hpo

    own = {n for n, v in vars(app.hpo).items() if getattr(v, "__module__", None) == "app.hpo"}
    handed_on = [
        n
        for n, v in vars(app.hpo).items()
        if not n.startswith("_")
        and callable(v)
        and n not in own
        and n not in {"dataclass"}
        and getattr(v, "__module__", "").startswith("app.")
    ]
    assert not handed_on, f"app.hpo re-exports {handed_on}: import them from their homes"


def test_the_training_defaults_live_once_in_the_schema():
    """conf/training/default.yaml sets nothing: `training=default` is app/config/training.py's
    defaults, so the two can never disagree (they once did: lr 1e-3 against 3e-3)."""
    from omegaconf import OmegaConf

    from app.config import TrainingConfig
    from tests.conftest import config

    assert not OmegaConf.load(ROOT / "conf" / "training" / "default.yaml")
    assert config(["gpu=cpu"]).training == TrainingConfig()


def test_the_fleet_is_given_what_it_needs_not_the_sweeper():
    """The fleet once held the sweeper and read its config and context, and read the hpo node
    again: now it gets its plan, the config its launcher needs and a job factory, and the hpo
    node is read once, by the settings."""
    import dataclasses

    from hydra_plugins.hydratrain_optuna_sweeper._sweep._fleet_run import Fleet

    given = [
        f.name for f in dataclasses.fields(Fleet) if f.init and f.default is dataclasses.MISSING
    ]
    assert given == ["plan", "config", "make_job"]
    # ...and what it starts itself: a local fleet's worker processes, none when made.
    assert [f.name for f in dataclasses.fields(Fleet) if f.name not in given] == ["workers"]
    plugin = ROOT / "hydra_plugins" / "hydratrain_optuna_sweeper"
    readers = {p.name for p in plugin.rglob("*.py") if "read_hpo(" in p.read_text()}
    assert readers == {"_settings.py"}, readers
