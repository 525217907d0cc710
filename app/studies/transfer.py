"""Tune small, train large: what a study records of how its trials are parametrized, and the
command that trains the target width with its best configuration (μP: docs/hpo.md, "A proxy
study and its target").

The sweeper records a `Parametrization` on every study it runs (a study user attribute, read
back by a later study's warm start, which takes values only between studies of the same
parametrization, base width and base head width), and with `hpo.transfer.target` the overrides
that make the proxy the target. optimization_results.yaml and report.html then give the target's
command: the best trial's own overrides, the target's after them; with `hpo.transfer.run` the
sweep runs it once the study ends and records how it went (`TargetRun`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

RECORD = "hpo:parametrization"  # study user attr: Parametrization.attrs()
TARGET_RUN = "hpo:transfer_run"  # study user attr: TargetRun.attrs()
TARGET_DIR = "target"  # the target run's directory in the sweep's
EXPORT = "training.export=true"  # the target is the model the user wants: exported


@dataclass(frozen=True)
class Parametrization:
    """How a study's trials are parametrized: standard, or μP at its widths."""

    name: str = "standard"  # model.parametrization
    base_width: int | None = None  # model.mup.base_width (μP)
    width: int | None = None  # model.n_embd of its trials (the proxy's)
    target: tuple[str, ...] = ()  # hpo.transfer.target: the overrides that make the target
    # The head width μP's attention is stated at (model.mup.base_head_dim, or null's meaning:
    # the trials' own head width): the scale attn_mult means a multiple of
    base_head_dim: int | None = None

    def attrs(self) -> dict[str, object]:
        return {**asdict(self), "target": list(self.target)}

    @classmethod
    def of(cls, attrs: Mapping[str, object]) -> Parametrization:
        """The study's record (a study without one, from before it existed: standard)."""
        found = attrs.get(RECORD)
        if not isinstance(found, Mapping):
            return cls()
        base, width, target = found.get("base_width"), found.get("width"), found.get("target")
        name = str(found.get("name", "standard"))
        # A μP study recorded before the base head width existed scaled its attention by
        # attn_mult / d_head: a base head width of 1
        head = found.get("base_head_dim", 1 if name == "mup" else None)
        return cls(
            name=name,
            base_width=base if isinstance(base, int) else None,
            width=width if isinstance(width, int) else None,
            target=tuple(str(t) for t in target) if isinstance(target, list) else (),
            base_head_dim=head if isinstance(head, int) else None,
        )

    @property
    def mup(self) -> bool:
        return self.name == "mup"

    def describe(self) -> str:
        if not self.mup:
            return f"model.parametrization={self.name}"
        return f"μP at width {self.width} (model.mup.base_width={self.base_width})"

    def mismatch(self, source: Parametrization) -> str | None:
        """Why `source`'s values do not carry over to this study as they are (None: they do):
        under another parametrization, or μP stated at another base width, the same learning
        rate is another rate."""
        if source.name != self.name:
            return f"was run under {source.describe()}, this study under {self.describe()}"
        if self.mup and source.base_width != self.base_width:
            return (
                f"states its hyperparameters at model.mup.base_width={source.base_width}, this "
                f"study at {self.base_width}"
            )
        if self.mup and source.base_head_dim != self.base_head_dim:
            return (
                f"states its attention at head width {source.base_head_dim} "
                f"(model.mup.base_head_dim), this study at {self.base_head_dim}"
            )
        return None


@dataclass(frozen=True)
class TargetRun:
    """The target run a sweep launched once its study ended (hpo.transfer.run)."""

    run_dir: str
    status: str  # a run's status word: completed, failed ...
    value: float | None = None  # its hpo.metric (the study's first objective)
    device_seconds: float | None = None

    def attrs(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def of(cls, attrs: Mapping[str, object]) -> TargetRun | None:
        found = attrs.get(TARGET_RUN)
        if not isinstance(found, Mapping):
            return None
        value, seconds = found.get("value"), found.get("device_seconds")
        return cls(
            run_dir=str(found.get("run_dir", "")),
            status=str(found.get("status", "")),
            value=float(value) if isinstance(value, int | float) else None,
            device_seconds=float(seconds) if isinstance(seconds, int | float) else None,
        )


@dataclass(frozen=True)
class Transfer:
    """What a μP study's report and results say of its target."""

    record: Parametrization
    command: str | None  # the target's, with the best configuration (None: no best, no target)
    run: TargetRun | None = None  # hpo.transfer.run's

    def section(self) -> dict[str, object]:
        """optimization_results.yaml's `transfer:`."""
        r = self.record
        return {
            "parametrization": r.name,
            "base_width": r.base_width,
            "base_head_dim": r.base_head_dim,
            "proxy_width": r.width,
            "target": list(r.target),
            **({"command": self.command} if self.command else {}),
            **({"run": self.run.attrs()} if self.run is not None else {}),
        }


def target_overrides(trial: Sequence[str], target: Sequence[str]) -> list[str]:
    """The best trial's overrides with the target's in place of any it sets, then the export."""
    keys = {_key(o) for o in target}
    kept = [o for o in trial if _key(o) not in keys]
    export = [] if "training.export" in keys else [EXPORT]
    return [*kept, *target, *export]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")
