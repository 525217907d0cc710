"""The suite's command line. Bad input is one `error:` line and exit status 2."""

from __future__ import annotations

import argparse
from typing import NoReturn

from app.core.errors import fail
from app.gpu_suite.breaks import MODES
from app.gpu_suite.suite import Step


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def parse(argv: list[str] | None, steps: list[Step]) -> argparse.Namespace:
    p = Parser(
        prog="python -m app.gpu_suite",
        description="Every GPU check of the trainer in one command, with a report.",
    )
    p.add_argument("--out", help="report directory (report.md, report.json, logs, run dirs)")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (CI)")
    p.add_argument("--steps", help="numbers and ranges, e.g. 1-4 or 1,3,5-9")
    p.add_argument("--only", help="step names, comma-separated (see --list)")
    p.add_argument("--part", type=int, help="the steps of part N (see --list), one device call")
    p.add_argument(
        "--from",
        dest="earlier",
        metavar="REPORT_JSON",
        help="an earlier loan's report.json (e.g. docs/gpu-suite/<card>.json): its steps are kept "
        "in DIR's report, and --pending leaves them out",
    )
    p.add_argument("--pending", action="store_true", help="skip steps DIR's report has done")
    p.add_argument("--budget-min", type=float, default=35.0, help="start no step past this")
    p.add_argument("--limit", action="append", default=[], metavar="STEP=SECONDS")
    p.add_argument("--jobs", type=int, help="dry run: steps side by side (default: 2)")
    p.add_argument("--list", action="store_true", help="list the steps and their limits")
    p.add_argument("--break", dest="breaks", action="append", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.list and not args.out:
        fail("--out DIR is required (where report.md and report.json go)")
    if args.budget_min <= 0:
        fail(f"--budget-min={args.budget_min:g} must be a positive number of minutes")
    if args.earlier is not None:
        earlier(args.earlier)
    args.jobs = jobs(args)
    args.selected = select(args, steps)
    args.limits = limits(args.limit, steps)
    args.break_map = break_map(args.breaks, steps)
    return args


def jobs(args: argparse.Namespace) -> int:
    if args.jobs is None:
        return 2 if args.dry_run else 1
    if args.jobs < 1:
        fail(f"--jobs={args.jobs} must be 1 or more")
    if args.jobs > 1 and not args.dry_run:
        fail("--jobs runs steps side by side: only with --dry-run (on a GPU they share the card)")
    return int(args.jobs)


def select(args: argparse.Namespace, steps: list[Step]) -> list[Step]:
    from app.gpu_suite.steps import parts

    chosen = [o for o, v in (("--steps", args.steps), ("--only", args.only), ("--part", args.part))
              if v is not None]  # fmt: skip
    if len(chosen) > 1:
        fail(f"{' and '.join(chosen)} are alternatives: give one")
    if args.part is not None:
        planned = parts(steps)
        if not 1 <= args.part <= len(planned):
            fail(f"--part={args.part} is not a part; the parts are 1-{len(planned)} (see --list)")
        return planned[args.part - 1]
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        _known(names, steps, "--only")
        return [s for s in steps if s.name in names]
    if args.steps:
        numbers = numbers_of(args.steps, len(steps))
        return [s for s in steps if s.number in numbers]
    return list(steps)


def numbers_of(spec: str, count: int) -> set[int]:
    """`1-4`, `2,5`, `1,3-5` -> step numbers, each within 1..count."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            fail(f"--steps={spec}: '{part}' is not a number or a range like 1-4")
        if not 1 <= first <= last <= count:
            fail(f"--steps={spec}: '{part}' is outside 1-{count} (or reversed)")
        out.update(range(first, last + 1))
    return out


def limits(items: list[str], steps: list[Step]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        _known([name], steps, "--limit")
        try:
            out[name] = float(value)
        except ValueError:
            fail(f"--limit {item}: the limit must be a number of seconds, as in {name}=300")
        if out[name] <= 0:
            fail(f"--limit {item}: the limit must be positive")
    return out


def break_map(items: list[str], steps: list[Step]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, _, mode = item.partition(":")
        _known([name], steps, "--break")
        if mode not in MODES:
            fail(f"--break {item}: the mode must be one of {', '.join(MODES)}")
        out[name] = mode
    return out


def _known(names: list[str], steps: list[Step], option: str) -> None:
    known = [s.name for s in steps]
    for name in names:
        if name not in known:
            fail(f"{option}: no step named '{name}'; the steps are: {', '.join(known)}")


def earlier(path: str) -> None:
    from pathlib import Path

    from app.gpu_suite import report

    if not report.load_file(Path(path)).steps:
        fail(f"--from {path}: not a report of the suite (a report.json an earlier part wrote)")
