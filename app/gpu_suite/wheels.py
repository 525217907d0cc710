"""Dependencies on a GPU machine without a network: the wheels carried in `.whl/`.

A GPU image often has torch, transformers, tensorboard and nvidia-ml-py but not Hydra, Optuna,
pytest, accelerate or datasets. When one of those is missing and `.whl/` holds wheels (gathered
beforehand by scripts/device_wheels.sh), they are installed with
`pip install --no-index --no-deps --target .whl/py<version>/site-packages`, which goes on the
children's PYTHONPATH, after the repository root: the project is imported from the tree, never
pip-installed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

NEEDED = ("hydra", "omegaconf", "optuna", "pytest", "accelerate", "datasets")


def missing() -> list[str]:
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def prepare_site(repo: Path) -> tuple[Path | None, str]:
    """The directory to put on PYTHONPATH (None: nothing to add) and what was done."""
    absent = missing()
    if not absent:
        return None, "all present in this Python"
    wheels = sorted((repo / ".whl").glob("*.whl"))
    if not wheels:
        return None, f"missing {', '.join(absent)}; .whl/ holds no wheels"
    # A path holding "site-packages": dill (under `datasets`) pickles classes of modules from
    # anywhere else by value, and fails on pyarrow's; from there, by reference, as usual.
    site = repo / ".whl" / f"py{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    stamp = site / ".installed"
    names = "\n".join(w.name for w in wheels)
    if stamp.is_file() and stamp.read_text() == names:
        return site, f"missing {', '.join(absent)}: {len(wheels)} wheels installed before"
    how = _install(wheels, site)
    stamp.write_text(names)
    return site, f"missing {', '.join(absent)}: {len(wheels)} wheels from .whl/ {how}"


def _install(wheels: list[Path], site: Path) -> str:
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    argv += ["--no-compile", "--no-cache-dir", "--target", str(site), *map(str, wheels)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode == 0:
        return "installed with pip --target"
    # An image without pip: a wheel is a zip laid out as site-packages.
    for wheel in wheels:
        _unzip(wheel, site)
    return "unpacked (pip failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1] + ")"


def _unzip(wheel: Path, site: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for data in site.glob("*.data"):
        for kind in ("purelib", "platlib"):
            for item in (data / kind).glob("*") if (data / kind).is_dir() else []:
                shutil.move(str(item), str(site / item.name))
        shutil.rmtree(data, ignore_errors=True)
