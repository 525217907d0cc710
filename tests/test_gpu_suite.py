"""The GPU suite (`python -m app.gpu_suite`): its CPU dry run end to end, and how it records
failures, time-outs and interruptions, with steps built here in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from app.gpu_suite import breaks, configcheck, render, report
from app.gpu_suite.context import StepContext, Suite
from app.gpu_suite.runner import run_command
from app.gpu_suite.steps import STEPS
from app.gpu_suite.suite import Step, run_steps
from tests import procs

pytestmark = pytest.mark.e2e

ROOT, PY = procs.ROOT, procs.PY


def suite_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return procs.run([PY, "-m", "app.gpu_suite", *args], timeout=timeout)


def load(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


# --- report.json's schema -------------------------------------------------------------------

HEADER_KEYS = {"device", "driver", "torch", "cuda", "python", "git_commit", "mode", "updated"}
STEP_KEYS = {
    "number": int,
    "name": str,
    "title": str,
    "status": str,
    "reason": (str, type(None)),
    "seconds": (int, float),
    "limit_s": (int, float),
    "device": (str, type(None)),
    "finished_at": (str, type(None)),
    "commands": list,
    "figures": dict,
    "checks": list,
    "tail": list,
}
COMMAND_KEYS = {
    "label": str,
    "command": str,
    "argv": list,
    "status": str,
    "rc": (int, type(None)),
    "seconds": (int, float),
    "limit_s": (int, float, type(None)),
    "reason": (str, type(None)),
    "log": (str, type(None)),
    "tail": list,
    "gpu_command": (str, type(None)),
    "config_check": (str, type(None)),
}
CHECK_KEYS = {"name": str, "ok": bool, "detail": str, "goal": bool}


def assert_schema(data: dict) -> None:
    assert data["schema"] == "hydratrain-gpu-suite/1"
    assert set(data["header"]) >= HEADER_KEYS
    assert isinstance(data["parts"], list) and data["parts"]
    for step in data["steps"]:
        _typed(step, STEP_KEYS)
        assert step["status"] in ("passed", "failed", "timed_out", "skipped", "not_run")
        for cmd in step["commands"]:
            _typed(cmd, COMMAND_KEYS)
            assert cmd["status"] in ("ok", "failed", "timed_out", "skipped")
        for check in step["checks"]:
            _typed(check, CHECK_KEYS)


def _typed(record: dict, keys: dict) -> None:
    assert set(record) == set(keys), set(record) ^ set(keys)
    for key, kind in keys.items():
        assert isinstance(record[key], kind), (key, record[key])


# --- the dry run, end to end ----------------------------------------------------------------


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("suite")
    proc = suite_cli("--dry-run", "--out", str(out))
    return proc, out


@pytest.mark.slow
def test_the_dry_run_passes_every_step_and_reports_every_command(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = load(out)
    assert_schema(data)
    assert [s["name"] for s in data["steps"]] == [s.name for s in STEPS]
    assert {s["name"]: s["status"] for s in data["steps"]} == {s.name: "passed" for s in STEPS}
    md = (out / "report.md").read_text()
    for step in data["steps"]:
        assert step["commands"], step["name"]
        assert f"### {step['number']}. {step['name']}" in md
        for cmd in step["commands"]:
            assert cmd["command"] in md, cmd["label"]
            assert cmd["status"] in ("ok", "skipped"), cmd
            assert cmd["status"] == "ok" or cmd["reason"], cmd
            if cmd["gpu_command"] and cmd["gpu_command"] != cmd["command"]:
                assert cmd["gpu_command"] in md


@pytest.mark.slow
def test_the_dry_run_runs_the_cpu_parts_and_checks_the_gpu_commands(dry_run):
    _, out = dry_run
    steps = {s["name"]: s for s in load(out)["steps"]}
    # Every step ran something on the CPU (tiny sizes) and read figures from it.
    for name, step in steps.items():
        assert any(c["status"] == "ok" for c in step["commands"]), name
        assert step["figures"] and all(c["ok"] for c in step["checks"]), name
    # What needs CUDA is skipped with the command a GPU run uses, whose settings the
    # trainer accepted (`--cfg job`).
    compile_bench = next(c for c in steps["bench"]["commands"] if c["label"] == "bench compile")
    assert compile_bench["status"] == "skipped" and compile_bench["reason"] == "no CUDA"
    assert "--profile gpt2_small" in compile_bench["command"]
    trainer = [c for s in steps.values() for c in s["commands"] if " app.train " in c["command"]]
    absent = "not in this version"  # a setting the trainer does not have yet: not checked
    checked = [c for c in trainer if "--cfg" not in c["command"] and absent not in str(c["reason"])]
    assert len(checked) >= 15 and all(c["config_check"] == "ok" for c in checked)
    assert steps["default_run"]["figures"]["dtype"] == "fp32"
    ddp = next(c for c in steps["scale"]["commands"] if c["label"] == "ddp")
    assert "torch.distributed.run" in ddp["command"] and ddp["reason"] == "no CUDA"
    fsdp = next(c for c in steps["scale"]["commands"] if c["label"] == "fsdp")
    assert "training.parallelism=fsdp" in fsdp["command"] and fsdp["reason"] == "no CUDA"


# --- failures, time-outs and interruptions, with steps built here ---------------------------


def make_suite(out: Path, **kw) -> Suite:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return Suite(ROOT, out, env, dry=False, gpus=1, device="test device", grace_s=1.0, **kw)


def command_step(number: int, name: str, code: str, limit_s: float = 60) -> Step:
    def body(ctx: StepContext) -> None:
        argv = [PY, "-c", code]
        ctx.sh(name, argv, dry=argv, limit_s=limit_s, needs_gpus=0)

    return Step(number, name, f"runs {name}", limit_s, body)


FAILS = "import sys; [print(f'noise {i}') for i in range(50)]; print('the cause'); sys.exit(3)"


def test_a_failing_step_is_recorded_with_its_last_lines_and_the_next_steps_run(tmp_path):
    steps = [
        command_step(1, "breaks", FAILS),
        command_step(2, "after", "print('fine')"),
        command_step(3, "last", "print('fine too')"),
    ]
    rep = report.Report()
    run_steps(steps, make_suite(tmp_path), rep, {}, budget_s=600)
    first, second, third = load(tmp_path)["steps"]
    assert first["status"] == "failed" and first["reason"] == "breaks: exit status 3"
    assert first["tail"][-1] == "the cause" and "noise 49" in first["tail"]
    assert first["commands"][0]["rc"] == 3
    assert second["status"] == third["status"] == "passed"
    md = (tmp_path / "report.md").read_text()
    assert "**failed**: breaks: exit status 3" in md and "the cause" in md


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_dead(pids: list[int], seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_a_command_past_its_limit_is_killed_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    argv = breaks.command("hang", pids)
    outcome = run_command(
        argv, cwd=ROOT, env=dict(os.environ), limit_s=2, log_path=tmp_path / "log"
    )
    assert outcome.timed_out and outcome.rc is None  # the hang sleeps far past the limit
    parent, child = map(int, pids.read_text().split())
    assert wait_dead([parent, child]) == []


def test_a_timed_out_step_is_recorded_as_such_and_the_suite_goes_on(tmp_path):
    def hangs(ctx: StepContext) -> None:
        argv = breaks.command("hang", ctx.dir / "pids")
        ctx.sh("hangs", argv, dry=argv, limit_s=600, needs_gpus=0)
        ctx.sh("never starts", [PY, "-c", "print(1)"], limit_s=60, needs_gpus=0)

    steps = [Step(1, "slow", "hangs", 600, hangs), command_step(2, "after", "print('ok')")]
    run_steps(steps, make_suite(tmp_path), report.Report(), {"slow": 2.0}, budget_s=600)
    slow, after = load(tmp_path)["steps"]
    assert slow["status"] == "timed_out" and slow["limit_s"] == 2.0
    assert slow["commands"][0]["status"] == "timed_out"
    assert slow["commands"][0]["reason"].startswith("killed after its")
    assert slow["commands"][1]["status"] == "timed_out"  # the step's time was spent
    assert "hanging on purpose" in slow["tail"]
    assert after["status"] == "passed"
    parent, child = map(int, (tmp_path / "01-slow" / "pids").read_text().split())
    assert wait_dead([parent, child]) == []


def test_the_report_is_on_disk_after_each_step_while_the_next_one_runs(tmp_path):
    release = threading.Event()

    def waits(ctx: StepContext) -> None:
        release.wait(30)

    steps = [command_step(1, "first", "print('done')"), Step(2, "second", "waits", 60, waits)]
    worker = threading.Thread(
        target=run_steps, args=(steps, make_suite(tmp_path), report.Report(), {}, 600)
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses = [s["status"] for s in load(tmp_path)["steps"]] if _ready(tmp_path) else []
            if statuses and statuses[0] == "passed":
                break
            time.sleep(0.05)
        assert statuses == ["passed", "not_run"]
    finally:
        release.set()
        worker.join()
    assert [s["status"] for s in load(tmp_path)["steps"]] == ["passed", "passed"]


def _ready(out: Path) -> bool:
    return (out / "report.json").is_file()


def test_a_step_that_raises_fails_with_its_traceback_and_the_next_runs(tmp_path):
    def raises(ctx: StepContext) -> None:
        raise KeyError("final_val_loss")

    steps = [Step(1, "raises", "raises", 60, raises), command_step(2, "after", "print(1)")]
    run_steps(steps, make_suite(tmp_path), report.Report(), {}, budget_s=600)
    first, second = load(tmp_path)["steps"]
    assert first["status"] == "failed" and "KeyError: 'final_val_loss'" in first["reason"]
    assert second["status"] == "passed"


def test_a_step_whose_limit_does_not_fit_the_budget_is_left_for_a_later_part(tmp_path):
    steps = [command_step(1, "big", "print(1)", limit_s=300), command_step(2, "small", "print(2)")]
    run_steps(steps, make_suite(tmp_path), report.Report(), {}, budget_s=100)
    big, small = load(tmp_path)["steps"]
    assert big["status"] == "not_run" and "budget" in big["reason"] and not big["commands"]
    assert small["status"] == "passed"


def test_a_gpu_command_with_a_bad_setting_fails_the_dry_run(tmp_path):
    def typo(ctx: StepContext) -> None:
        ctx.sh("typo", [PY, "-m", "app.train", "training.lrr=0.1"], limit_s=60)

    suite = make_suite(tmp_path)
    suite.dry, suite.gpus = True, 0
    run_steps([Step(1, "typo", "typo", 60, typo)], suite, report.Report(), {}, budget_s=600)
    (step,) = load(tmp_path)["steps"]
    cmd = step["commands"][0]
    assert cmd["status"] == "failed" and cmd["config_check"].startswith("error: training.lrr")
    assert step["status"] == "failed" and "training.lrr" in step["reason"]


def test_commands_needing_more_gpus_are_skipped_with_the_reason(tmp_path):
    def two(ctx: StepContext) -> None:
        ctx.sh("ddp", [PY, "-c", "print(1)"], limit_s=60, needs_gpus=2)

    run_steps([Step(1, "two", "two", 60, two)], make_suite(tmp_path), report.Report(), {}, 600)
    (step,) = load(tmp_path)["steps"]
    assert step["status"] == "skipped" and step["reason"] == "needs 2 GPUs (1 found)"


# --- the command line -----------------------------------------------------------------------


@pytest.mark.slow
def test_break_option_fails_a_step_and_the_next_one_still_runs(tmp_path):
    proc = suite_cli("--dry-run", "--out", str(tmp_path), "--only", "default_run,gpu_tests",
                     "--break", "default_run:fail")  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    first, second = load(tmp_path)["steps"]
    assert first["status"] == "failed" and first["reason"] == "train: exit status 3"
    assert first["tail"][-1] == "last line before the failure"
    assert second["status"] == "passed"
    assert "last line before the failure" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_sigterm_records_the_step_in_progress_kills_its_tree_and_keeps_the_report(tmp_path):
    cmd = [PY, "-m", "app.gpu_suite", "--dry-run", "--jobs", "1", "--out", str(tmp_path)]
    cmd += ["--only", "default_run,gpu_tests", "--break", "gpu_tests:hang"]
    suite = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids = tmp_path / "06-gpu_tests" / "break-pids.txt"
    try:
        deadline = time.monotonic() + 120
        while not pids.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids.is_file(), "the broken step never started"
        time.sleep(0.3)
        suite.send_signal(signal.SIGTERM)
        assert suite.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        suite.kill()
    first, second = load(tmp_path)["steps"]
    assert first["status"] == "passed"
    assert second["status"] == "failed" and "interrupted by signal 15" in second["reason"]
    assert wait_dead([int(p) for p in pids.read_text().split()]) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dry-run"], "--out DIR is required"),
        (["--out", "x", "--steps", "0-3"], "'0-3' is outside 1-10"),
        (["--out", "x", "--steps", "two"], "'two' is not a number"),
        (["--out", "x", "--only", "nope"], "no step named 'nope'"),
        (["--out", "x", "--steps", "1", "--only", "bench"], "--steps and --only"),
        (["--out", "x", "--limit", "bench=soon"], "must be a number of seconds"),
        (["--out", "x", "--budget-min", "0"], "--budget-min=0"),
        (["--out", "x", "--jobs", "2"], "only with --dry-run"),
        (["--out", "x", "--break", "bench:explode"], "mode must be one of"),
        (["--out", "x", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_command_lines_are_one_error_line_and_status_2(args, needle, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [PY, "-m", "app.gpu_suite", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (tmp_path / "x").exists()


def test_list_names_every_step_and_a_total_within_35_minutes():
    proc = suite_cli("--list")
    assert proc.returncode == 0
    for step in STEPS:
        assert step.name in proc.stdout
    assert sum(s.limit_s for s in STEPS) <= 35 * 60
    assert max(s.limit_s for s in STEPS) <= 9 * 60


# --- pieces ---------------------------------------------------------------------------------


def test_parts_merge_into_one_report_by_step_name(tmp_path):
    run_steps([command_step(1, "a", "print(1)"), command_step(2, "b", FAILS)],
              make_suite(tmp_path), report.load(tmp_path), {}, 600)  # fmt: skip
    rep = report.load(tmp_path)
    run_steps([command_step(2, "b", "print(2)")], make_suite(tmp_path), rep, {}, 600)
    steps = load(tmp_path)["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("a", "passed"), ("b", "passed")]


def test_trainer_overrides_are_found_in_plain_multirun_and_torchrun_commands():
    over = configcheck.trainer_overrides
    assert over([PY, "-m", "app.train", "a=1"]) == ["a=1"]
    assert over([PY, "-m", "app.train", "-m", "hpo=optuna", "a=1"]) == ["hpo=optuna", "a=1"]
    assert over([PY, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "app.train", "b=2"])
    assert over([PY, "-m", "app.train", "--cfg", "job", "x=1"]) is None
    assert over([PY, "-m", "app.bench", "--profile", "smoke"]) is None


def test_the_markdown_report_has_the_header_and_each_command_in_full():
    rec = report.StepRecord(1, "s", "a step", status="failed", reason="x: exit status 1")
    rec.commands = [report.CommandRecord("x", "python -m app.train a=1 'b=c d'", [], "failed", 1)]
    rec.tail = ["Traceback", "ValueError: boom"]
    rec.checks = [report.Check("goal met", False, "0.3", goal=True)]
    header = {"device": "NVIDIA H100 80GB HBM3", "driver": "550.1", "git_commit": "abc"}
    md = render.markdown(report.Report(header, [rec], []))
    assert "| device | NVIDIA H100 80GB HBM3 |" in md and "| driver | 550.1 |" in md
    assert "| 1 | s | failed |" in md
    assert "  python -m app.train a=1 'b=c d'\n" in md
    assert "- [ ] goal: goal met (0.3)" in md
    assert "```\nTraceback\nValueError: boom\n```" in md


def fake_wheel(directory: Path, module: str) -> Path:
    """A minimal pure-Python wheel holding one module."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-0.1-py3-none-any.whl"
    info = f"{module}-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        z.writestr(f"{info}/WHEEL", wheel)
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.mark.parametrize("pip_works", [True, False])
def test_missing_modules_come_from_the_wheels_in_dot_whl(tmp_path, monkeypatch, pip_works):
    from app.gpu_suite import wheels

    fake_wheel(tmp_path / ".whl", "suite_demo_mod")
    monkeypatch.setattr(wheels, "NEEDED", ("suite_demo_mod",))
    with monkeypatch.context() as m:
        if not pip_works:
            failed = subprocess.CompletedProcess([], 1, "", "No module named pip")
            m.setattr(wheels.subprocess, "run", lambda *a, **k: failed)
        site, note = wheels.prepare_site(tmp_path)
    assert site is not None and "site-packages" in str(site)
    assert note.startswith("missing suite_demo_mod: 1 wheels from .whl/")
    assert ("pip --target" in note) == pip_works
    probe = "import suite_demo_mod; print(suite_demo_mod.VALUE)"
    env = {**os.environ, "PYTHONPATH": str(site)}
    assert (
        subprocess.run([PY, "-c", probe], env=env, capture_output=True, text=True).stdout == "42\n"
    )
    assert wheels.prepare_site(tmp_path)[1].endswith("wheels installed before")


def test_pending_leaves_out_the_steps_the_report_has_done(tmp_path):
    from app.gpu_suite.__main__ import pending

    steps = [command_step(1, "a", "print(1)"), command_step(2, "b", "print(2)", limit_s=300)]
    run_steps(steps, make_suite(tmp_path), report.Report(), {}, budget_s=100)
    assert [s.name for s in pending(steps, report.load(tmp_path))] == ["b"]
