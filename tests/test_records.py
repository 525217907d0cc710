"""Typed records: summary.json is written from Summary, and a reader of a renamed field is
caught before it runs (by the type checker) or by a test (readers by name)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.records.batch import BatchDetails, Candidate, OomRecord, ProbeReport
from app.engine.records.summary import Summary
from app.engine.report import probed_samples_per_sec, trial_attrs
from app.hpo import RUN_METRICS, TrialAttrs, objectives

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_the_json_round_trips_and_flattens_the_task_metrics():
    s = Summary(status="completed", run_dir="r", steps=6, tokens_per_sec=10.0)
    s.initial_val, s.final_val = {"loss": 2.0, "accuracy": 0.5}, {"loss": 1.0, "accuracy": 0.7}
    s.task_fields = {"labels": ["a", "b"]}
    flat = s.to_json()
    assert flat["final_val_accuracy"] == 0.7 and flat["initial_val_loss"] == 2.0
    assert flat["labels"] == ["a", "b"]
    assert "mfu" not in flat and "export_dir" not in flat  # results never produced: left out
    assert Summary.from_json(flat) == s
    assert s.objective(["final_val_loss", "tokens_per_sec"]) == [1.0, 10.0]
    with pytest.raises(KeyError, match=r"'mfu' is not in summary\.json"):
        s.objective("mfu")


def test_the_batch_details_are_typed_and_keep_summary_jsons_flat_keys():
    """The probe's report and the OOMs are one typed record (BatchDetails), written as the flat
    mapping summary.json has always held and read back as the same record."""
    rows = [Candidate(8, True, False, 0.4, 900.0), Candidate(16, False, True, None, None)]
    probe = ProbeReport(1.5, 6, "largest", 0.9, rows, "cache.json", 40.5, 2)  # compiled
    ooms = OomRecord(count=2, alloc_retries=None, at_step=3, reduced_from=16)
    s = Summary(batch_details=BatchDetails(probe, ooms), effective_batch_size=32, world_size=2)
    flat = s.to_json()["batch_details"]
    assert isinstance(flat, dict)
    assert set(flat) == {
        "probe_seconds", "probe_steps", "chosen_by", "memory_limit_fraction", "candidates",
        "cache", "confirm_seconds", "graphs_compiled", "oom_count", "oom_at_step", "reduced_from",
    }  # fmt: skip
    assert flat["candidates"] == [
        {"micro": 8, "fits": True, "oom": False, "peak_fraction": 0.4, "samples_per_sec": 900.0},
        {"micro": 16, "fits": False, "oom": True, "peak_fraction": None, "samples_per_sec": None},
    ]
    back = Summary.from_json(json.loads(json.dumps(s.to_json())))
    assert back.batch_details == BatchDetails(probe, ooms)
    assert probed_samples_per_sec(back) == 2 * 900.0  # the fastest fitting row, times the ranks
    assert Summary.from_json(Summary().to_json()).batch_details == BatchDetails()  # set: empty


def test_every_objective_a_study_may_name_is_a_key_summary_json_holds():
    """Readers by name (hpo.metric=..., the sweeper's checks) against the record: a renamed
    Summary field or metric fails here."""
    s = Summary(mfu=0.1, final_train_loss=1.0, peak_memory_bytes=1, wall_time_s=1.0)
    s.tokens_per_sec = 1.0
    for task, metrics in (("causal_lm", ["loss"]), ("classification", ["loss", "accuracy", "f1"])):
        s.final_val = {m: 1.0 for m in metrics}
        known = objectives(task)
        assert known is not None
        assert set(known.final) <= set(s.to_json()), task
    assert set(RUN_METRICS) <= {f.name for f in dataclasses.fields(Summary)}


def test_a_trials_attributes_are_the_summarys_fields():
    names = {f.name for f in dataclasses.fields(Summary)}
    assert {f.name for f in dataclasses.fields(TrialAttrs)} <= names


def test_a_run_attaches_its_summarys_facts_to_its_trial():
    """Each of TrialAttrs' fields as the run's summary has it (the largest rank's peak memory
    for peak_memory_bytes): a field added to both and not copied fails here."""
    facts = dict(
        micro_batch_size=3, grad_accum_steps=5, batch_source="probed", effective_batch_size=15,
        lr=0.1, samples_seen=99, noise_scale=2.5, probe_samples_per_sec=7.0, tokens_per_sec=8.0,
        device_seconds=9.0, run_dir="r", status="completed",
        batch_schedule=[{"step": 0, "samples": 0, "batch": 4}, {"step": 2, "samples": 8,
                                                                 "batch": 8}],
    )  # fmt: skip
    attrs = trial_attrs(Summary(peak_memory_bytes=11, **facts))  # type: ignore[arg-type]
    expected = {**facts, "peak_memory_bytes": 11}
    assert set(expected) == {f.name for f in dataclasses.fields(TrialAttrs)}
    assert attrs.as_dict() == expected


def _readers(field: str) -> set[str]:
    """file:line of every `.field` attribute read in app/ and hydra_plugins/ (the record's own
    declaration aside)."""
    found = set()
    for folder in ("app", "hydra_plugins"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(rf"\.{field}\b", line):
                    found.add(f"{path.relative_to(ROOT)}:{n}")
    return found


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("mypy") is None and not Path(sys.executable).with_name("mypy").exists(),
    reason="needs mypy",
)
@pytest.mark.e2e
def test_renaming_a_summary_field_is_caught_by_the_type_checker_at_every_reader(tmp_path):
    """Summary.tokens_per_sec renamed in a copy of the code: mypy reports every line that reads
    it, the runner, the loop, the report, the bench and the GPU suite alike."""
    for folder in ("app", "hydra_plugins"):
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    if (
        ROOT / ".mypy_cache"
    ).is_dir():  # the checkout's own run (CI's): only what changed is checked
        shutil.copytree(ROOT / ".mypy_cache", tmp_path / ".mypy_cache")
    summary = tmp_path / "app" / "engine" / "records" / "summary.py"
    text = summary.read_text()
    assert "    tokens_per_sec: float | None = None" in text
    summary.write_text(text.replace("    tokens_per_sec: float", "    tokens_per_second: float"))
    mypy = Path(sys.executable).with_name("mypy")
    proc = subprocess.run(
        [str(mypy) if mypy.exists() else "mypy"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    flagged = {
        m.group(1)
        for line in proc.stdout.splitlines()
        if "tokens_per_sec" in line and (m := re.match(r"^(\S+?:\d+): error", line))
    }
    # The GPU suite reads only Summary records by attribute (the bench's rows are TypedDicts).
    summary_readers = {
        r
        for r in _readers("tokens_per_sec")
        if r.startswith("app/gpu_suite/")
        or "summary." in (ROOT / r.split(":")[0]).read_text().splitlines()[int(r.split(":")[1]) - 1]
    }
    assert summary_readers, "no reader found: the test would pass vacuously"
    assert any(r.startswith("app/gpu_suite/") for r in summary_readers), "the GPU suite reads keys"
    assert summary_readers <= flagged, summary_readers - flagged
