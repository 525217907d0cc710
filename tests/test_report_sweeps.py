"""The report a sweep leaves (report.html, by the fake trainer's sweeps: trials take
milliseconds), opened in a real browser: every section drawn, nothing fetched from the network,
no console error. The browser is the system's Chromium (Debian's `chromium` package, which CI
installs) driven by Playwright; without either the browser test skips with one line."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import optuna
import pytest

from app.studies.report.page import PLOTS
from hydra_plugins.hydratrain_optuna_sweeper._report._records import study_record
from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal
from tests import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m", "hpo=optuna"]
SCREENSHOT = ROOT / "outputs" / "test-artifacts" / "report.png"
optuna.logging.set_verbosity(optuna.logging.WARNING)

# (lr, batch) in the order trials run: lr 3e-3 is the fake's best (asha pauses it at the first
# rung, alone, and promotes it); batch 64 runs out of memory, lr 8.5e-3 diverges, 9.5e-3 raises.
# Reduction factor 2: lines enough go on to the end for the plots of completed trials.
MIXED = [(3e-3, 32), (1e-3, 32), (2e-3, 64), (8.5e-3, 32), (9.5e-3, 32), (3e-4, 32), (5e-4, 16),
         (2.5e-3, 16), (4e-3, 32), (1.5e-3, 16)]  # fmt: skip


def _sweep(tmp_path: Path, trials: list[tuple[float, int]], *extra: str):
    enqueue = ",".join(
        f"{{training.lr:{lr},training.effective_batch_size:{b}}}" for lr, b in trials
    )
    args = [
        f"hpo.n_trials={len(trials)}",
        "hpo.study_name=t",
        f"hpo.storage={tmp_path}/study.journal",
        f"hydra.sweep.dir={tmp_path}/multirun",
        "hpo.tensorboard=false",
        f"hpo.enqueue=[{enqueue}]",
        "fake.oom_above_batch=32",
        "fake.diverge_above_lr=8e-3",
        "fake.error_above_lr=9e-3",
        *extra,
    ]
    return procs.run([*FAKE, *args], env=procs.environment(out=tmp_path), timeout=240)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """An asha study with a trial of every ending: the sweep dir."""
    tmp_path = tmp_path_factory.mktemp("mixed")
    proc = _sweep(
        tmp_path,
        MIXED,
        "hpo.pruner=asha",
        "++hpo.pruner_args={reduction_factor:2}",
        "fake.grow_batch=16",  # its batch-16 trials record an adaptive batch
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = [line for line in proc.stdout.splitlines() if "[HYDRA]" in line][-2:]
    report = tmp_path / "multirun" / "report.html"
    assert last[-1].endswith(f"Report in {report}"), last  # the sweep's last line names it
    return tmp_path


def test_a_sweep_reports_each_trial_as_it_ended_with_its_line_and_batch_plan(mixed):
    study = optuna.load_study(study_name="t", storage=journal(str(mixed / "study.journal")))
    record = study_record(study, "journal")
    by_lr = {t.params["training.lr"]: t for t in record.trials if t.line == t.number}
    assert by_lr[2e-3].ending == "oom" and by_lr[8.5e-3].ending == "diverged"
    assert by_lr[9.5e-3].ending == "failed" and by_lr[9.5e-3].reason == "error"
    assert by_lr[3e-3].ending == "paused"  # the best, paused at the first rung...
    lines = {line.root.params["training.lr"]: line for line in record.lines()}
    assert lines[3e-3].ending == "promoted" and lines[3e-3].last.state == "COMPLETE"  # ...resumed
    assert lines[3e-3].curve[-1][0] == 20 and 5 in lines[3e-3].pauses
    assert by_lr[1e-3].grad_accum_steps == 1 and by_lr[1e-3].device_seconds == pytest.approx(0.5)
    out = mixed / "multirun"
    assert {p.name for p in out.glob("*.png")} == {
        "learning_curves.png", "optimization_history.png", "param_importances.png"
    }  # fmt: skip
    best = record.best()
    assert best is not None and best.command is not None
    rerun = "python -m app.train training.effective_batch_size=32 training.lr=0.003 "
    assert best.command.startswith(rerun)
    assert "hpo" not in best.command and "training.resume" not in best.command


def test_a_sweep_that_fails_still_leaves_its_report(tmp_path):
    """The failure rate passed: the sweep stops with its error line, the report shows the
    study as the storage holds it."""
    proc = _sweep(tmp_path, [(9.5e-3, 32), (9.8e-3, 32)], "hpo.pruner=none",
                  "hpo.max_failure_rate=0.1", "hpo.min_trials_for_failure_rate=1")  # fmt: skip
    assert proc.returncode == 1 and "error:" in proc.stderr
    html = (tmp_path / "multirun" / "report.html").read_text()
    assert "<section id='plan'>" in html and "<td>failed</td><td>error</td>" in html


def _chromium() -> str:
    pytest.importorskip("playwright.sync_api", reason="no Playwright: pip install playwright")
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    pytest.skip("no Chromium: apt-get install chromium (the report's browser test)")


SECTIONS_JS = """() => Array.from(document.querySelectorAll('section')).map(s => {
  const gd = s.querySelector('.js-plotly-plot');
  const n = a => a ? Array.from(a).filter(v => v !== null && v !== undefined).length : 0;
  let points = 0;
  for (const t of (gd && gd._fullData) || []) {
    const dims = t.dimensions ? n(t.dimensions[0].values) : 0;
    points += Math.max(n(t.x), n(t.y), dims);
  }
  const img = s.querySelector('img');
  return {id: s.id, drawn: s.dataset.drawn || null,
          svg: gd ? gd.querySelectorAll('.main-svg').length : 0, points,
          image: img ? img.naturalWidth : 0, rows: s.querySelectorAll('tbody tr').length};
})"""


def test_the_report_opens_offline_in_chromium_with_every_section_drawn(mixed):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    chromium = _chromium()
    page_file = mixed / "multirun" / "report.html"
    fetched, errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        context.route("**/*", lambda route: _local_only(route, fetched))
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        with contextlib.suppress(PlaywrightTimeout):  # the assertions below say what is missing
            page.wait_for_function(
                "document.querySelectorAll('.js-plotly-plot .main-svg').length > 0", timeout=20_000
            )
        sections = {s["id"]: s for s in page.evaluate(SECTIONS_JS)}
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        browser.close()
    assert not fetched and not errors, (fetched, errors)
    plots = [p.id for p in PLOTS if p.id != "pareto"]  # one objective
    for plot in plots:
        s = sections[plot]
        assert s["drawn"] == "true" and s["svg"] > 0 and s["points"] > 0, s
    for table in ("best", "workers", "spent", "plan"):
        assert sections[table]["rows"] > 0, sections[table]
    study = optuna.load_study(study_name="t", storage=journal(str(mixed / "study.journal")))
    assert sections["plan"]["rows"] == len(study.trials) > len(MIXED)  # and the promotions
    assert "pareto" not in sections


def _local_only(route, fetched: list[str]) -> None:
    url = route.request.url
    if url.startswith(("file:", "data:", "blob:")):
        route.continue_()
    else:
        fetched.append(url)
        route.abort()
