"""The settings that are a word or a number reach the engine typed: load_config resolves `auto`,
an int and null once, and what the engine and the data loaders read is never the word."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app.components.data.loader import resolve_num_workers
from app.components.data.rows import map_processes
from app.config import ConfigError
from app.config.training import EvalMicroBatch, ResumeFrom
from app.engine.batch_plan import EVAL_FACTOR, eval_micro_size
from app.engine.saving import checkpoint as ckpt
from tests.conftest import config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("setting", "fixed"),
    [("training.micro_batch_size=auto", None), ("training.micro_batch_size=4", 4)],
)
def test_micro_batch_is_an_int_or_none(setting, fixed):
    assert config(["gpu=cpu", setting]).training.fixed_micro_batch == fixed


@pytest.mark.parametrize(
    ("setting", "typed", "evaluated_at"),
    [
        ("null", EvalMicroBatch(), None),  # the training micro-batch
        ("auto", EvalMicroBatch(scaled=True), EVAL_FACTOR * 4),
        ("6", EvalMicroBatch(size=6), 6),
    ],
)
def test_eval_micro_batch_is_resolved_once(setting, typed, evaluated_at):
    training = config(["gpu=cpu", f"training.eval_micro_batch_size={setting}"]).training
    assert training.eval_micro_batch == typed
    assert eval_micro_size(training.eval_micro_batch, 4) == evaluated_at


def test_the_engine_reads_no_word():
    """The engine's readers take the typed values: handed the raw word they fail, so a reader
    that went back to the setting would be caught here."""
    with pytest.raises(AttributeError):
        eval_micro_size("auto", 4)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        ckpt.find_resume_checkpoint("auto", Path("."))  # type: ignore[arg-type]


def test_resume_is_none_this_run_or_a_path(tmp_path):
    def resume(setting: str) -> ResumeFrom | None:
        return config(["gpu=cpu", f"training.resume={setting}"]).training.resume_from

    saved = tmp_path / "step_00000002.pt"
    saved.write_bytes(b"")
    assert resume("null") is None
    assert resume("auto") == ResumeFrom()  # this run directory's own checkpoints
    assert resume(str(saved)) == ResumeFrom(str(saved))
    assert ckpt.find_resume_checkpoint(ResumeFrom(), tmp_path) is None  # none there yet
    assert ckpt.find_resume_checkpoint(resume(str(saved)), tmp_path) == saved


@pytest.mark.parametrize(("setting", "fixed"), [("auto", None), ("0", 0), ("3", 3)])
def test_data_workers_and_map_processes_are_ints_or_none(setting, fixed, monkeypatch):
    data = config(["gpu=cpu", f"data.num_workers={setting}", "data.map_num_proc=2"]).data
    assert data.fixed_num_workers == fixed and data.fixed_map_num_proc == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert resolve_num_workers(data.fixed_num_workers, 5) == (5 if fixed is None else fixed)
    assert map_processes(data.fixed_map_num_proc, 10) == 2


def test_typed_values_follow_a_replace_and_stay_out_of_the_settings():
    """`dataclasses.replace` (the runner's LR-scaled copy) types the settings again; the typed
    values are not settings: not keys, not in the recorded config."""
    training = config(["gpu=cpu", "training.micro_batch_size=4"]).training
    assert dataclasses.replace(training, micro_batch_size="auto").fixed_micro_batch is None
    names = {f.name for f in dataclasses.fields(training)}
    assert not names & {"fixed_micro_batch", "eval_micro_batch", "resume_from"}
    assert "fixed_micro_batch" not in dataclasses.asdict(training)


@pytest.mark.parametrize(
    ("setting", "keys"),
    [("final_val_loss", "final_val_loss"), ("[final_val_loss,tokens_per_sec]", None)],
)
def test_objective_is_a_key_or_a_list_of_keys(setting, keys):
    typed = config(["gpu=cpu", f"objective={setting}"]).objective_keys
    assert typed == (keys or ["final_val_loss", "tokens_per_sec"])


def test_an_objective_of_neither_is_refused_on_entry():
    with pytest.raises(ConfigError, match=r"^objective=5 must be a summary.json key or a list"):
        config(["gpu=cpu", "objective=5"])
