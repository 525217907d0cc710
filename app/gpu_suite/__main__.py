"""Command line of the GPU suite (see the package docstring and docs/observability.md,
"GPU suite")."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from app.core.errors import fail
from app.gpu_suite import cli, machine, wheels
from app.gpu_suite import report as rpt
from app.gpu_suite.context import Suite
from app.gpu_suite.steps import STEPS, parts
from app.gpu_suite.suite import Interrupted, Step, run_steps, save

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    args = cli.parse(argv, STEPS)
    if args.list:
        print(step_table(STEPS))
        return 0
    out = out_dir(args.out)
    os.chdir(REPO)  # children run from the repository root, where `app` is imported from
    site, deps = wheels.prepare_site(REPO)
    env = child_env(site, args.dry_run, out)
    facts = machine.device_facts(sys.executable, REPO, env)
    suite = Suite(REPO, out, env, args.dry_run, int(facts.get("gpus") or 0), facts["device"])
    suite.breaks = args.break_map
    report = rpt.load(out)
    if args.earlier:
        report = rpt.merged(rpt.load_file(Path(args.earlier)), report)
    report.header.update(header(facts, deps, args.dry_run, site))
    report.parts.append({"started": rpt.now(), "command": shown(argv), "device": suite.device})
    blocker = cannot_run(facts, args.dry_run)
    if blocker:
        save(suite, report)
        print(f"error: {blocker}", file=sys.stderr)
        return 1
    steps = pending(args.selected, report) if args.pending else args.selected
    return run(steps, suite, report, args)


def run(steps: list[Step], suite: Suite, report: rpt.Report, args: argparse.Namespace) -> int:
    _on_signals()
    try:
        run_steps(steps, suite, report, args.limits, args.budget_min * 60, args.jobs)
    except Interrupted as exc:
        save(suite, report)
        return 128 + exc.signum
    save(suite, report)
    names = {s.name for s in steps}
    ran = [s for s in report.steps if s.name in names]
    print(f"report: {suite.out / 'report.md'}")
    return 1 if any(s.status in ("failed", "timed_out") for s in ran) else 0


def out_dir(value: str) -> Path:
    """DIR relative to the repository root when it lies inside it (short, portable commands
    in the report), else absolute."""
    path = Path(value).expanduser().resolve()
    if path.exists() and not path.is_dir():
        fail(f"--out {value} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {value} cannot be created: {exc.strerror}")
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def child_env(site: Path | None, dry: bool, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Token data and micro-batch caches of this suite's own: the probe measures this card,
    # and nothing cached by earlier runs on the machine answers for it.
    env["HYDRATRAIN_CACHE"] = str(out / "cache")
    paths = [str(REPO), *([str(site)] if site else []), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"  # a killed command's log ends where it stopped
    env.setdefault("HYDRA_FULL_ERROR", "1")
    if dry:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU rehearsal, also on a machine with a GPU
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def header(facts: machine.Facts, deps: str, dry: bool, site: Path | None) -> dict[str, object]:
    h: dict[str, object] = {"device": facts.get("device"), "gpus": facts.get("gpus")}
    h |= {"driver": facts.get("driver"), "torch": facts.get("torch"), "cuda": facts.get("cuda")}
    h |= {"python": facts.get("python"), "missing_modules": facts.get("missing_modules")}
    h["mode"] = "dry run (tiny sizes, CPU)" if dry else "GPU"
    h["git_commit"] = machine.git_commit(REPO)
    h["dependencies"] = deps
    h["cwd"] = "the repository root, PYTHONPATH=." + (f":{site.relative_to(REPO)}" if site else "")
    return h


def cannot_run(facts: machine.Facts, dry: bool) -> str | None:
    essential = [m for m in facts.get("missing_modules", []) if m in machine.ESSENTIAL]
    if essential:
        names = ", ".join(essential)
        return (
            f"missing Python modules {names}: gather wheels into .whl/ (scripts/device_wheels.sh)"
        )
    if not dry and not facts.get("gpus"):
        why = facts.get("torch_error") or f"torch {facts.get('torch')} sees no CUDA device"
        return f"no GPU here ({why}); --dry-run rehearses the suite on the CPU"
    return None


def pending(steps: list[Step], report: rpt.Report) -> list[Step]:
    done = {s.name for s in report.steps if s.status in rpt.DONE}
    return [s for s in steps if s.name not in done]


def step_table(steps: list[Step]) -> str:
    rows = []
    for n, part in enumerate(parts(steps), 1):
        minutes = sum(s.limit_s for s in part) / 60
        rows.append(f"part {n} ({minutes:.1f} min, one call: --part {n})")
        rows += [
            f"  {s.number:>2}  {s.name:<12} {s.limit_s / 60:5.1f} min  {s.title}" for s in part
        ]
    total = sum(s.limit_s for s in steps) / 60
    return "\n".join([*rows, f"      {'total':<12} {total:5.1f} min"])


def shown(argv: list[str] | None) -> str:
    return "python -m app.gpu_suite " + " ".join(sys.argv[1:] if argv is None else argv)


def _on_signals() -> None:
    def stop(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)


if __name__ == "__main__":
    sys.exit(main())
