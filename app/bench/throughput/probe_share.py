"""`python -m app.bench --probe-share`: what choosing the micro-batch costs a run, compiled
(model.compile=true) and eager.

Each round runs `python -m app.train OVERRIDES training.max_steps=100` three ways, in turn, each
with a micro-batch cache of its own (so each probes afresh): eager with the micro-batch probed;
compiled with it probed; compiled with the size that run chose set by hand (no probe: the same
run without choosing). The compiler's cache (TORCHINDUCTOR_CACHE_DIR) is one for the bench,
filled by a compiled run before the rounds, which is reported apart (`cold`): a user's second
compiled run finds its graphs there too. Reported per arm: the micro-batch of each round, and
medians of the probe's search seconds, its compiled confirmation's seconds, the graphs compiled
(by the probe, by the run in all), the run's wall (summary.json) and the process's, and the
probe's share of the run's wall; then, paired by round, what the probed compiled run took more
than the same run with its size set. `--checkout DIR` runs another checkout's trainer (an
earlier commit's, for a before-and-after) with this bench.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.bench.throughput.report import median_or_none

STEPS = 100
ARMS = ("eager, probed", "compiled, probed", "compiled, set by hand")


@dataclass(frozen=True)
class ShareRun:
    """One run's figures: from its summary.json and the process's own wall clock."""

    arm: str
    micro_batch_size: int | None
    chosen_by: str | None
    probe_seconds: float | None
    confirm_seconds: float | None
    probe_graphs: int | None
    run_graphs: int | None
    wall_s: float | None
    process_s: float
    status: str | None


def run_probe_share_bench(
    overrides: Sequence[str], rounds: int, checkout: Path | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="probe-share-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
        if checkout is not None:
            env["PYTHONPATH"] = str(checkout)
        cwd = checkout or Path.cwd()
        start = _load()
        cold = _train(work, "cold", ARMS[1], [*overrides, "model.compile=true"], env, cwd)
        runs = [cold]
        for i in range(rounds):
            eager = _train(work, f"{i}-e", ARMS[0], [*overrides, "model.compile=false"], env, cwd)
            probed = _train(work, f"{i}-c", ARMS[1], [*overrides, "model.compile=true"], env, cwd)
            fixed = [*overrides, "model.compile=true"]
            fixed.append(f"training.micro_batch_size={probed.micro_batch_size or 'auto'}")
            runs += [eager, probed, _train(work, f"{i}-f", ARMS[2], fixed, env, cwd)]
    return {
        "overrides": list(overrides),
        "steps": STEPS,
        "rounds": rounds,
        "checkout": str(checkout) if checkout else None,
        "load_before_after": [start, _load()],
        "runs": [asdict(r) for r in runs],
    }


def _train(
    work: Path, name: str, arm: str, overrides: list[str], env: dict[str, str], cwd: Path
) -> ShareRun:
    run_dir = work / name
    argv = [sys.executable, "-m", "app.train", *overrides, f"training.max_steps={STEPS}"]
    argv += ["training.progress_bar=false", f"training.auto_batch.cache_dir={run_dir / 'plans'}"]
    argv += [f"hydra.run.dir={run_dir}", f"data.cache_dir={work / 'data'}"]
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=True)
    process_s = time.perf_counter() - started
    s = json.loads((run_dir / "summary.json").read_text())
    probe = s.get("batch_details") or {}
    print(f"probe-share {name} ({arm}): {process_s:.1f}s", file=sys.stderr, flush=True)
    return ShareRun(
        arm=arm,
        micro_batch_size=s.get("micro_batch_size"),
        chosen_by=probe.get("chosen_by"),
        probe_seconds=probe.get("probe_seconds"),
        confirm_seconds=probe.get("confirm_seconds"),
        probe_graphs=probe.get("graphs_compiled"),
        run_graphs=s.get("compiled_graphs"),
        wall_s=s.get("wall_time_s"),
        process_s=process_s,
        status=s.get("status"),
    )


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _text(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def probe_share_table(report: dict[str, Any]) -> str:
    runs = [ShareRun(**r) for r in report["runs"]]
    lines = [
        f"{report['steps']} steps, {report['rounds']} rounds, medians; load average "
        f"{report['load_before_after'][0]} before, {report['load_before_after'][1]} after",
        "",
        "| arm | micro-batch | probe s | confirm s | graphs probe / run | run wall s "
        "| process s | probe / run wall |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    rows = [("cold", [runs[0]])] + [(a, [r for r in runs[1:] if r.arm == a]) for a in ARMS]
    for label, group in rows:
        shares = [r.probe_seconds / r.wall_s for r in group if r.probe_seconds and r.wall_s]
        graphs = " / ".join(
            _text(median_or_none([getattr(r, key) for r in group]), 0)
            for key in ("probe_graphs", "run_graphs")
        )
        lines.append(
            f"| {label} | {','.join(str(r.micro_batch_size) for r in group)} "
            f"| {_text(median_or_none([r.probe_seconds for r in group]))} "
            f"| {_text(median_or_none([r.confirm_seconds for r in group]))} | {graphs} "
            f"| {_text(median_or_none([r.wall_s for r in group]))} "
            f"| {_text(median_or_none([r.process_s for r in group]))} "
            f"| {_text(median_or_none(shares), 3)} |"
        )
    lines += ["", _paired(runs[1:])]
    return "\n".join(lines)


def _paired(runs: list[ShareRun]) -> str:
    """The probed compiled run against the same run with its size set, round by round."""
    probed = [r for r in runs if r.arm == ARMS[1]]
    fixed = [r for r in runs if r.arm == ARMS[2]]
    extra = [p.process_s - f.process_s for p, f in zip(probed, fixed, strict=True)]
    share = [e / p.process_s for e, p in zip(extra, probed, strict=True)]
    return (
        f"compiled and probed vs the same run with its micro-batch set: "
        f"{_text(median_or_none(extra))} s more ({_text(median_or_none(share), 3)} of its process "
        f"wall), median of {len(extra)} paired rounds"
    )
