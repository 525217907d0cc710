"""A study's report for tools outside a sweep (`python -m app.report`): any study of any storage,
this sweeper's or one written by plain Optuna. The seam: nothing outside the sweeper imports its
`_` modules. Hydra's plugin scan imports this module: Optuna is imported only when used."""

from __future__ import annotations

from pathlib import Path


class ReportError(Exception):
    """A storage or study that cannot be read: one line naming the argument."""


def write_study_report(storage: str, study_name: str | None, out: str | None) -> Path:
    """Write report.html (and its PNGs) for `study_name` of `storage` (a database URL or an
    Optuna journal file) into `out` (default: `default_out`)."""
    import optuna

    from ._errors import SweepConfigError
    from ._report._records import study_record
    from ._study._storage import Masker, open_storage, storage_spec

    if "://" not in storage and not Path(storage).is_file():
        raise ReportError(f"--storage={storage!r}: no such journal file (or give a database URL)")
    mask = Masker.of([storage])
    try:
        store = open_storage(storage_spec(storage, "--storage", ".", False), mask)
        names = optuna.get_all_study_names(store)
    except SweepConfigError as e:
        raise ReportError(str(e)) from None
    except Exception as e:
        raise ReportError(mask(f"--storage={storage!r} cannot be read: {e}")) from None
    # A study's companions (`<study>:<metric>`) and its warm start's claim
    # (`<study>:hpo:warm_start`) are not studies of their own to report.
    own = [n for n in names if not any(n.startswith(f"{m}:") for m in names if m != n)]
    name = _pick(study_name, own)
    study = optuna.load_study(study_name=name, storage=store)
    target = Path(out) if out else default_out(storage, name)
    from app.studies.report import write_report

    return write_report(study_record(study, mask(storage)), study, target)


def default_out(storage: str, study_name: str) -> Path:
    """<the journal's folder, or here>/<study>: the studies of one folder (outputs/hpo/*.journal)
    keep a report each, beside their sweeps (outputs/hpo/<study>/<time>/)."""
    base = Path(storage).parent if "://" not in storage else Path(".")
    return base / study_name.replace("/", "_")


def _pick(name: str | None, names: list[str]) -> str:
    """The study asked for, or the storage's only study (companions `<study>:<metric>` aside)."""
    if name is not None and name in names:
        return name
    listed = ", ".join(names) or "none"
    if name is not None:
        raise ReportError(f"--study={name!r} is not in the storage (its studies: {listed})")
    if len(names) != 1:
        raise ReportError(f"--study is needed: the storage holds {len(names)} ({listed})")
    return names[0]
