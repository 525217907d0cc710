"""Bad input ends the process with one line naming the setting, before any work is done."""

from __future__ import annotations

import runpy
import sys

import pytest
import torch

from app.cli.preflight import one_line, split_argv
from app.config import ConfigError, load_config
from app.engine.records.summary import Summary
from tests import procs
from tests.conftest import compose, invoke_here, tiny

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("training.effective_batch_size=0", "training.effective_batch_size=0"),
        ("training.micro_batch_size=-4", "training.micro_batch_size=-4"),
        ("training.micro_batch_size=64", "larger than training.effective_batch_size=32"),
        ("model.n_head=5", "model.n_embd=128 must be divisible by model.n_head=5"),
        ("data.seq_len=1000", "data.seq_len=1000 exceeds model.max_position_embeddings"),
        ("training.host_malloc=jemalloc", "training.host_malloc='jemalloc' is not allowed"),
        ("precision=bf16", None),  # fine on CPU: bf16 autocast is allowed there
    ],
)
def test_validate_names_the_key(override, needle):
    cfg = compose([override])
    if needle is None:
        load_config(cfg)
        return
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_bf16_on_pre_ampere_preset_is_rejected_without_a_device():
    with pytest.raises(ConfigError, match=r"precision=bf16 is not supported by gpu=t4"):
        load_config(compose(["gpu=t4", "precision=bf16"]))


def test_unknown_option_lists_the_allowed_ones():
    with pytest.raises(Exception) as exc:
        compose(["gpu=rtx9090"])
    line = one_line(exc.value)
    assert line.startswith("gpu=rtx9090 is not an option of 'gpu'")
    assert "rtx4090" in line and "h100" in line and "\n" not in line


def test_misspelled_key_names_it_and_the_known_keys():
    with pytest.raises(Exception) as exc:
        compose(["training.lr_typo=1"])
    line = one_line(exc.value)
    assert line.startswith("training.lr_typo: no such setting in training")
    assert "effective_batch_size" in line


def test_wrong_type_names_the_key():
    with pytest.raises(Exception) as exc:
        compose(["training.max_steps=many"])
    assert one_line(exc.value).startswith("training.max_steps:")


def test_null_for_a_setting_that_needs_a_value_says_so():
    with pytest.raises(Exception) as exc:
        compose(["training.host_malloc=null"])
    assert one_line(exc.value).startswith("training.host_malloc=null is not allowed; give a value")


def test_split_argv_skips_hydra_flags_and_multirun():
    inv = split_argv(["--cfg", "job", "gpu=cpu", "hydra.run.dir=x"])
    assert (inv.config_name, inv.overrides, inv.hydra_overrides) == (
        "train",
        ["gpu=cpu"],
        ["hydra.run.dir=x"],
    )
    assert not inv.runs_job  # --cfg prints the config: nothing is checked on disk
    assert split_argv(["gpu=cpu"]).runs_job
    assert split_argv(["-cd", "extra", "experiment=mine"]).config_dirs[0].endswith("extra")
    assert split_argv(["-m", "hpo=optuna"]).multirun
    assert split_argv(["--help"]) is None


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["gpu=rtx9090"], "gpu=rtx9090 is not an option"),  # refused while composing
        (["training.micro_batch_size=64"], "training.micro_batch_size=64"),  # by the schema
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    """The process as a user sees it: exit status 2, one `error:` line on stderr. Every other
    bad input is checked in-process (tests/test_bad_inputs.py, its table of cases)."""
    proc = procs.train(*args, f"hydra.run.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_cuda_preset_without_cuda(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["app.train", "gpu=rtx4090", "precision=bf16", "--cfg", "job"])
    runpy.run_module("app.train", run_name="__main__", alter_sys=True)
    shown = capsys.readouterr().out
    assert "name: rtx4090" in shown and "name: bf16" in shown
    code, _, err = invoke_here(
        ["gpu=rtx4090", "precision=bf16", f"hydra.run.dir={tmp_path}"], monkeypatch, capsys
    )
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [lines[0]] and "gpu=rtx4090 needs a CUDA device" in lines[0]
    assert "gpu=cpu or gpu=auto" in lines[0]


@pytest.mark.integration
def test_corrupt_checkpoint_on_resume_is_one_line_and_untouched(tmp_path, monkeypatch, capsys):
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    bad = ckpt_dir / "step_00000004.pt"
    bad.write_bytes(b"not a checkpoint")
    argv = [*tiny(tmp_path), "training.resume=auto", f"hydra.run.dir={tmp_path / 'run'}"]
    code, _, err = invoke_here(argv, monkeypatch, capsys)
    assert code == 2, err
    assert "training.resume: checkpoint" in err and "unreadable" in err
    assert bad.read_bytes() == b"not a checkpoint"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step_00000004.pt"]


@pytest.mark.integration
def test_out_of_memory_even_at_micro_batch_1_is_one_line(tmp_path, monkeypatch, capsys):
    argv = [*tiny(tmp_path, "faults.oom_above_micro_batch=0"), f"hydra.run.dir={tmp_path}/r"]
    code, _, err = invoke_here(argv, monkeypatch, capsys)
    assert code == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: out of memory at micro-batch 1")
    assert "Traceback" not in err
    summary = Summary.read(tmp_path / "r")
    assert summary.status == "oom" and summary.oom_count == 3  # 4 -> 2 -> 1 -> out


class _Writes:
    """A stderr that keeps each write() apart, as the terminal under torchrun receives them."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(
    ("ending", "code"),
    [
        (ConfigError("training.lr=-1: must be > 0"), 2),
        (RuntimeError("a peer ended the trial"), 1),
    ],
)
def test_the_last_line_is_one_write_so_ranks_never_merge_it(monkeypatch, ending, code):
    """Under torchrun every rank writes to one stream; print() writes a line's text and its
    newline apart, and two ranks ending together once merged their lines into one."""
    from app.core.errors import fail
    from app.train import end_with_one_line

    stderr = _Writes()
    monkeypatch.setattr(sys, "stderr", stderr)
    with pytest.raises(SystemExit) as exited:
        end_with_one_line(ending)
    assert exited.value.code == code
    with pytest.raises(SystemExit):
        fail("data.seq_len=0: must be > 0")
    assert stderr.writes == [f"error: {ending}\n", "error: data.seq_len=0: must be > 0\n"]
