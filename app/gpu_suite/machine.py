"""What the suite runs on: the device, driver, versions and missing modules, asked of a child
interpreter (the suite itself imports neither torch nor the trainer's running code), and the git
commit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TypedDict

# What the trainer, its tests and its bench import; pynvml is optional (no NVML scalars).
MODULES = (
    "torch",
    "transformers",
    "hydra",
    "omegaconf",
    "optuna",
    "yaml",
    "tensorboard",
    "pytest",
    "accelerate",
    "datasets",
    "pynvml",
)
ESSENTIAL = ("torch", "transformers", "hydra", "omegaconf", "optuna", "yaml")

FACTS = r"""
import importlib.util, json, platform, sys
out = {"python": platform.python_version()}
out["missing_modules"] = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["gpus"] = n
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    out["devices"] = [
        f"{p.name} ({p.total_memory / 2**30:.0f} GiB, sm {p.major}.{p.minor})" for p in props
    ]
except Exception as exc:
    out["torch_error"] = repr(exc)
    out["gpus"] = 0
try:
    import pynvml
    pynvml.nvmlInit()
    v = pynvml.nvmlSystemGetDriverVersion()
    out["driver"] = v.decode() if isinstance(v, bytes) else v
except Exception as exc:
    out["driver"] = f"unknown (NVML: {type(exc).__name__})"
print("FACTS " + json.dumps(out))
"""


class Facts(TypedDict, total=False):
    """What FACTS prints, and `device`, the line the report shows for the devices."""

    python: str
    missing_modules: list[str]
    torch: str
    cuda: str | None
    gpus: int
    devices: list[str]
    torch_error: str
    driver: str
    device: str
    facts_error: str


def device_facts(python: str, cwd: Path, env: dict[str, str]) -> Facts:
    argv = [python, "-c", FACTS, *MODULES]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {"gpus": 0, "facts_error": "the device query took over 180 s"}
    for line in proc.stdout.splitlines():
        if line.startswith("FACTS "):
            facts: Facts = json.loads(line[len("FACTS ") :])
            devices = facts.get("devices") or []
            facts["device"] = ", ".join(devices) if devices else "CPU only (no CUDA device)"
            return facts
    return {"gpus": 0, "facts_error": (proc.stderr or proc.stdout).strip()[-500:]}


def git_commit(repo: Path) -> str:
    """The commit, marked dirty when the tree has changes; a copy without .git says so."""
    try:
        head = _git(repo, "rev-parse", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head} (with uncommitted changes)" if dirty else head


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout.strip()
