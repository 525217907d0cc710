"""The parent: runs each arm in subprocesses (rounds, or lockstep on CPU) and collects."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypeVar

from app.bench.throughput.lockstep import Lane, run_turns
from app.bench.throughput.profiles import PROFILES, Arm, Profile, ablations
from app.bench.throughput.report import (
    Report,
    Row,
    RunResult,
    add_ratios,
    aggregate,
    machine_info,
    unit_rate,
)
from app.bench.throughput.workers import Spec

Key = tuple[str, str]  # (variant or ablation, contender or arm)
Results = dict[Key, list[RunResult]]  # every round's run of each arm
V = TypeVar("V")


def run_benchmark(args: argparse.Namespace) -> Report:
    prof = PROFILES[args.profile]
    contenders = [c for c in args.contenders.split(",") if c]
    variants = _pick(prof["variants"], args.variants)
    arms = {
        (v, c): Arm(c, c, [*extra, *args.overrides])
        for v, extra in variants.items()
        for c in contenders
    }
    results = run_rounds(args, prof, arms)
    rows: list[Row] = []
    for (variant, contender), runs in results.items():
        rows.append({"variant": variant, "contender": contender, **aggregate(runs)})
    add_ratios(rows, key=lambda r: r["variant"], baseline=lambda r: r["contender"] == "bare")
    return {"kind": "benchmark", **setup_info(args, prof), "rows": rows, "runs": _flat(results)}


def run_ablations(args: argparse.Namespace) -> Report:
    prof = PROFILES[args.profile]
    groups = _pick(ablations(args.profile), args.only)
    arms = {
        (name, arm.label): Arm(
            arm.label, arm.contender, [*arm.overrides, *args.overrides], arm.options, arm.env
        )
        for name, group in groups.items()
        for arm in group
    }
    results = run_rounds(args, prof, arms)
    rows: list[Row] = []
    for (name, label), runs in results.items():
        rows.append(
            {
                "ablation": name,
                "arm": label,
                "contender": arms[name, label].contender,
                **aggregate(runs),
            }
        )
    firsts = {name: group[0].label for name, group in groups.items()}
    add_ratios(
        rows, key=lambda r: r["ablation"], baseline=lambda r: firsts[r["ablation"]] == r["arm"]
    )
    return {"kind": "ablation", **setup_info(args, prof), "rows": rows, "runs": _flat(results)}


def _pick(table: dict[str, V], names: str | None) -> dict[str, V]:
    if not names:
        return table
    wanted = [n.strip() for n in names.split(",")]
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)}; choose from: {', '.join(table)}")
    return {n: table[n] for n in wanted}


def _flat(results: Results) -> list[dict[str, object]]:
    return [{"group": g, "arm": a, **r} for (g, a), runs in results.items() for r in runs]


def setup_info(args: argparse.Namespace, prof: Profile) -> Report:
    return {
        "command": "python -m app.bench " + " ".join(sys.argv[1:]),
        "profile": args.profile,
        "rounds": args.rounds,
        "schedule": "lockstep" if _lockstep(args, prof) else "rounds",
        "warmup_steps": args.warmup or prof["warmup"],
        "measured_steps": args.steps or prof["steps"],
        "overrides": [*prof["overrides"], *args.overrides],
        "machine": machine_info(),
    }


def run_rounds(args: argparse.Namespace, prof: Profile, arms: dict[Key, Arm]) -> Results:
    """Every arm once per round; a failed run is recorded.

    In lockstep, the arms of each group (a variant, or an ablation option) run together and
    their turn order rotates every step (app/bench/throughput/lockstep.py). Otherwise they run one
    after another and the order rotates each round (a, b, c; b, c, a; c, a, b; ...), so over a
    multiple of the number of arms each one runs equally often in every slot: on a shared machine
    the slot alone was measured to move a contender by several percent."""
    results: Results = {key: [] for key in arms}
    keys = list(arms)
    warmup, steps = args.warmup or prof["warmup"], args.steps or prof["steps"]
    for rnd in range(args.rounds):
        if _lockstep(args, prof):
            done: dict[Key, RunResult] = {}
            for group in dict.fromkeys(k[0] for k in keys):  # ratios are within a group
                done |= run_lockstep(
                    {k: arms[k] for k in keys if k[0] == group}, prof, warmup, steps
                )
        else:
            shift = rnd % len(keys)
            done = {
                key: run_worker(arms[key], prof, warmup, steps)
                for key in keys[shift:] + keys[:shift]
            }
        for key, res in done.items():
            res["round"] = rnd
            results[key].append(res)
            _progress_line(key, res)
    return results


def _lockstep(args: argparse.Namespace, prof: Profile) -> bool:
    chosen = getattr(args, "lockstep", None)
    return prof.get("lockstep", False) if chosen is None else chosen


def _progress_line(key: Key, res: RunResult) -> None:
    if "error" in res:
        print(f"  {key}: FAILED {res['error']}", file=sys.stderr, flush=True)
        return
    print(
        f"  {key[0]} / {key[1]}: {unit_rate(res):,.0f} {res.get('unit', 'tokens')}/s, "
        f"peak {res['peak_memory_bytes'] / 2**20:,.0f} MiB, first step {res['first_step_s']:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def run_worker(arm: Arm, prof: Profile, warmup: int, steps: int) -> RunResult:
    """One run of one arm, alone on the machine."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec = _spec(arm, prof, warmup, steps, Path(tmp))
        spec_path = _write_spec(spec)  # last: the clock starts as the process is launched
        proc = subprocess.run(
            _worker_argv(spec_path), env=_env(arm), capture_output=True, text=True
        )
        return _collect(proc.returncode, Path(spec["out"]), (proc.stderr or proc.stdout))


def run_lockstep(
    arms: dict[Key, Arm], prof: Profile, warmup: int, steps: int
) -> dict[Key, RunResult]:
    """One run of each arm, all in lockstep (app/bench/throughput/lockstep.py): each sets up alone,
    then they take turns step by step."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        lanes: dict[Key, Lane] = {}
        outs: dict[Key, Path] = {}
        for i, (key, arm) in enumerate(arms.items()):
            sub = Path(tmp) / str(i)
            sub.mkdir()
            lane = Lane(key, sub / "log.txt")
            spec = _spec(arm, prof, warmup, steps, sub, baton=list(lane.child_fds))
            outs[key] = Path(spec["out"])
            lane.start(_worker_argv(_write_spec(spec)), _env(arm))
            lanes[key] = lane
        run_turns(list(lanes.values()), warmup + steps)
        return {
            key: _collect(lane.finish(), outs[key], lane.log_tail()) for key, lane in lanes.items()
        }


def _spec(
    arm: Arm, prof: Profile, warmup: int, steps: int, tmp: Path, baton: list[int] | None = None
) -> Spec:
    return {
        "contender": arm.contender,
        "overrides": [*prof["overrides"], *arm.overrides],
        "options": arm.options,
        "warmup": warmup,
        "steps": steps,
        "tmp": str(tmp),
        "out": str(tmp / "result.json"),
        "baton": baton,  # lockstep: the worker's (go, done) pipe ends
    }


def _write_spec(spec: Spec) -> Path:
    path = Path(spec["tmp"]) / "spec.json"
    path.write_text(json.dumps({**spec, "start_time": time.time()}))
    return path


def _worker_argv(spec_path: Path) -> list[str]:
    return [sys.executable, "-m", "app.bench", "--worker", str(spec_path)]


def _env(arm: Arm) -> dict[str, str]:
    return {**os.environ, **arm.env}


def _collect(returncode: int, out: Path, output: str) -> RunResult:
    if returncode != 0 or not out.is_file():
        tail = output.strip().splitlines()[-3:]
        return {"error": f"exit {returncode}: {' | '.join(tail)}"}
    result: RunResult = json.loads(out.read_text())
    return result
