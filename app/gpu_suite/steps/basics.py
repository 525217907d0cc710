"""Steps 1 and 2: the gpu-marked tests, and the default run on the card."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from app.engine.records.summary import Summary
from app.gpu_suite import readers
from app.gpu_suite.context import StepContext
from app.gpu_suite.steps.common import (
    TINY,
    completed,
    log_of,
    loss_fell,
    probe_figures,
    run_figures,
    train,
)

PROBE_SHARE_GOAL = 0.10  # of the default run's wall on a card, the probe's seconds at most


def gpu_test_files(repo: Path) -> list[str]:
    """Only the files holding gpu-marked tests are collected: an optional package another
    test file imports, missing from a GPU image, cannot fail this step."""
    found = [
        str(p.relative_to(repo))
        for p in sorted((repo / "tests").glob("test_*.py"))
        if re.search(r"\bmark\.gpu\b", p.read_text(errors="replace"))
    ]
    return found or ["tests"]


def gpu_tests(ctx: StepContext) -> None:
    junit = ctx.dir / "junit.xml"
    files = gpu_test_files(ctx.suite.repo)
    argv = ctx.py("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider")
    argv += [f"--junitxml={junit}", *files]
    ctx.sh("pytest -m gpu", argv, dry=argv, limit_s=70)
    with ctx.reading("junit.xml"):
        r = readers.junit(junit)
        for key, value in dataclasses.asdict(r).items():
            ctx.figure(key, value)
        detail = f"{r.failures} failures, {r.errors} errors"
        ctx.check("no gpu test failed", r.tests > 0 and not r.failures + r.errors, detail)
        if not ctx.dry:
            ran = f"{r.passed} passed, {r.skipped} skipped"
            ctx.check("the gpu tests ran on the card", r.passed > 0, ran)


def default_run(ctx: StepContext) -> None:
    gpu, dry = train(ctx, "run", {"gpu": "auto", "precision": "auto"}, TINY)
    rec = ctx.sh("train", gpu, dry=dry, limit_s=115)
    if rec.status != "ok":
        return
    with ctx.reading("the run"):
        s = readers.summary(ctx.dir / "run")
        run_figures(ctx, s)
        share = probe_figures(ctx, s)
        completed(ctx, s, "run")
        loss_fell(ctx, s, "run")
        banner_checks(ctx, s, readers.printed(log_of(ctx, "train")))
        if not ctx.dry:
            what = f"the probe at most {PROBE_SHARE_GOAL:.0%} of the run's wall"
            ok = share is not None and share <= PROBE_SHARE_GOAL
            ctx.check(what, ok, f"{share}", goal=True)


def banner_checks(ctx: StepContext, s: Summary, printed: list[str]) -> None:
    """The plan printed at start is the one summary.json records: its device and precision
    lines are built from the record and looked for in the output (app/engine/report.py prints
    them); that they were printed is the one fact here that summary.json does not hold."""
    lines = [line.rstrip() for line in printed]
    device, precision = s.device_line(), s.precision_line()
    ctx.figure("banner: device", device.removeprefix("device").strip() if device in lines else None)
    ctx.figure(
        "banner: precision",
        precision.removeprefix("precision").strip() if precision in lines else None,
    )
    ctx.check("banner names the preset", device in lines, device)
    ctx.check("banner names dtype and reason", precision in lines)
    if not ctx.dry:
        on_card = (s.device or "").startswith("cuda") and s.preset != "cpu"
        ctx.check("trained on the card with its preset", on_card, f"{s.preset}")
