"""A refused run leaves its run directory as it found it, even after Hydra has written to it.

The start checks (app/cli/callbacks.py) refuse what the config and the files alone can show,
before Hydra writes anything. Some settings can only be refused once the run has started: a
data column that is not there, a tracker that cannot start. By then Hydra has rewritten
`.hydra/` and appended to the job's log, and the run has opened its TensorBoard file. Pointed
at a finished run (`hydra.run.dir=outputs/long`), such a refusal would leave the finished run's
`.hydra/` saying the refused config.

So, in a single run, a Hydra callback (app/cli/callbacks.py) records what a start writes to the
run directory as it is before Hydra writes to it, and a refusal before training starts puts it
back: Hydra's files restored, logs cut back to their length, new logger files removed, a
directory the refused run created removed. Once training starts the guard is disarmed: from
then on what the run writes is its own.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# Files Hydra rewrites on every start; small, so their bytes are kept whole.
_REWRITTEN = ("config.yaml", "hydra.yaml", "overrides.yaml")
# What a run writes before training starts (Hydra's config and log, the loggers' files): only
# these are put back. Anything else in the directory (the user's cwd, say) is never touched.
_MANAGED = (".hydra", "tensorboard", "wandb", "metrics.jsonl")


def _managed(root: Path) -> list[Path]:
    """The managed entries under root now, deepest first."""
    top = [p for p in root.iterdir() if p.name in _MANAGED or p.suffix == ".log"]
    found = [q for p in top if p.is_dir() and not p.is_symlink() for q in p.rglob("*")]
    return sorted([*top, *found], key=lambda p: len(p.parts), reverse=True)


@dataclass
class RunDirSnapshot:
    root: Path
    existed: bool
    sizes: dict[Path, int] = field(default_factory=dict)  # managed files, by their length
    dirs: set[Path] = field(default_factory=set)
    kept: dict[Path, bytes] = field(default_factory=dict)  # Hydra's own files, whole

    @classmethod
    def take(cls, root: Path) -> RunDirSnapshot:
        snap = cls(root, root.is_dir())
        for path in _managed(root) if snap.existed else []:
            if path.is_dir() and not path.is_symlink():
                snap.dirs.add(path)
            elif path.is_file():
                snap.sizes[path] = path.stat().st_size
                if path.parent.name == ".hydra" and path.name in _REWRITTEN:
                    snap.kept[path] = path.read_bytes()
        return snap

    def restore(self) -> None:
        if not self.root.is_dir():
            return
        for path in _managed(self.root):
            if path.is_dir() and not path.is_symlink():
                if path not in self.dirs:
                    shutil.rmtree(path, ignore_errors=True)
            elif path.parent.is_dir():
                self._restore_file(path)
        for path, data in self.kept.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if not self.existed and not any(self.root.iterdir()):
            self.root.rmdir()  # the refused run made it, and left nothing else there

    def _restore_file(self, path: Path) -> None:
        if path in self.kept:
            return  # written back whole below
        size = self.sizes.get(path)
        try:
            if size is None:
                path.unlink(missing_ok=True)
            elif path.stat().st_size > size:
                with open(path, "r+b") as f:  # a log the refused run appended to
                    f.truncate(size)
        except FileNotFoundError:
            pass  # gone already


_armed: RunDirSnapshot | None = None


def arm(run_dir: Path) -> None:
    """Record the run directory as it is, before Hydra writes to it (app/cli/callbacks.py)."""
    global _armed
    _armed = RunDirSnapshot.take(run_dir.absolute())


def disarm() -> None:
    """Training starts: what the run writes from here on is its own."""
    global _armed
    _armed = None


def restore_after_refusal() -> None:
    """The run was refused before training: put its directory back as it was (a no-op in a
    sweep's job, or once training has started). Under torchrun every rank took a snapshot of
    the same directory; rank 0 alone puts it back."""
    global _armed
    snap, _armed = _armed, None
    if snap is not None and os.environ.get("RANK", "0") == "0":
        snap.restore()
