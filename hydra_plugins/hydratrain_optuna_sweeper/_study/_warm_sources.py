"""hpo.warm_start's settings and sources: an earlier study named by its storage and name, or
by a sweep's directory, opened to be read. One that is not there is one line, and nothing is
created: a journal file or SQLite database that does not exist is not opened (opening would
make it)."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from app.config.hpo import WarmStartConfig

from .._errors import SweepConfigError, first_line
from .._pruners._kind import pruners_comparing_reports
from ._storage import JOURNAL_NAME, Masker, StorageSpec, open_storage, storage_spec

KEY = "hpo.warm_start"
TAKES = ("enqueue", "observe")


def open_source(entry: object, key: str, mask: Masker) -> tuple[optuna.Study, str]:
    """The source study and how lines name it."""
    spec, name = _source(entry, key)
    label = f"study {name!r} in {mask(spec.text)}"
    _check_exists(spec, key)
    try:
        storage = open_storage(spec, mask)
        names = optuna.get_all_study_names(storage)
    except SweepConfigError:
        raise
    except Exception as e:  # an unreachable database, a file that is not a journal
        raise SweepConfigError(f"{key}: {label} cannot be read: {mask(first_line(e))}") from None
    if name not in names:
        known = ", ".join(names) or "none"
        raise SweepConfigError(f"{key}: no study {name!r} in {mask(spec.text)}; it holds: {known}")
    return optuna.load_study(study_name=name, storage=storage), label


def storage_exists(spec: StorageSpec) -> bool:
    """A journal file or SQLite database is there (opening one that is not would create it);
    any other storage is taken to be."""
    path = sqlite_path(spec)
    return path is None or Path(path).is_file()


def sqlite_path(spec: StorageSpec) -> str | None:
    """The file of a journal or of a SQLite URL (sqlite:///PATH, sqlite+DRIVER:///PATH?...)."""
    target = str(spec.target)
    if spec.kind == "journal":
        return target
    scheme, sep, rest = target.partition(":///")
    if spec.kind == "url" and sep and scheme.split("+")[0] == "sqlite":
        return rest.partition("?")[0]
    return None


def _check_exists(spec: StorageSpec, key: str) -> None:
    if not storage_exists(spec):
        raise SweepConfigError(f"{key}: no study storage at {sqlite_path(spec)}")


def _source(entry: object, key: str) -> tuple[StorageSpec, str]:
    """(storage, study name) of one source: {storage, study_name} or {sweep_dir}."""
    if not isinstance(entry, dict):
        raise SweepConfigError(
            f"{key}={entry!r}: give {{storage: PATH_OR_URL, study_name: NAME}} or "
            "{sweep_dir: DIR}"
        )
    unknown = sorted(set(entry) - {"storage", "study_name", "sweep_dir"})
    if unknown:
        raise SweepConfigError(
            f"{key}.{unknown[0]}: no such key; known: storage, study_name, sweep_dir"
        )
    if "sweep_dir" in entry:
        if set(entry) & {"storage", "study_name"}:
            raise SweepConfigError(f"{key}: give a sweep_dir, or storage and study_name, not both")
        return _from_sweep_dir(Path(str(entry["sweep_dir"])), key)
    if not entry.get("storage") or not entry.get("study_name"):
        raise SweepConfigError(f"{key}: needs both storage and study_name (or a sweep_dir)")
    spec = storage_spec(entry["storage"], f"{key}.storage", ".", null_is_memory=False)
    if spec.kind == "memory":
        raise SweepConfigError(f"{key}.storage: a study in memory ended with its sweep")
    return spec, str(entry["study_name"])


def _from_sweep_dir(sweep_dir: Path, key: str) -> tuple[StorageSpec, str]:
    results = sweep_dir / "optimization_results.yaml"
    if not results.is_file():
        raise SweepConfigError(f"{key}.sweep_dir: no {results.name} in {sweep_dir}")
    try:
        data = yaml.safe_load(results.read_text()) or {}
    except yaml.YAMLError as e:
        raise SweepConfigError(f"{key}.sweep_dir: {results} is not YAML: {first_line(e)}") from None
    name = data.get("study_name") if isinstance(data, dict) else None
    journal = sweep_dir / JOURNAL_NAME
    if not name:
        raise SweepConfigError(f"{key}.sweep_dir: {results} names no study")
    if not journal.is_file():
        raise SweepConfigError(
            f"{key}.sweep_dir: its study is not in {journal}; give storage and study_name"
        )
    return StorageSpec("journal", str(journal.absolute()), f"{key}.sweep_dir"), str(name)


def check_settings(cfg: WarmStartConfig, objectives: int, compares_reports: bool = True) -> None:
    if cfg.take not in TAKES:
        raise SweepConfigError(
            f"{KEY}.take={cfg.take!r} is not allowed; choose one of: {', '.join(TAKES)}"
        )
    if isinstance(cfg.top_k, bool) or not isinstance(cfg.top_k, int) or cfg.top_k < 1:
        raise SweepConfigError(f"{KEY}.top_k={cfg.top_k!r} must be an integer >= 1")
    if not cfg.rungs:
        return
    if cfg.take != "observe":
        raise SweepConfigError(f"{KEY}.rungs=true brings observed reports: needs take=observe")
    if not compares_reports or objectives != 1:
        raise SweepConfigError(
            f"{KEY}.rungs=true: this study's pruner does not compare reports at a step "
            f"({pruners_comparing_reports()} does, for one objective); set rungs=false"
        )
