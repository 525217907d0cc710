"""training.parallelism=fsdp and the OOM agreement, with 2 ranks under torchrun on CPU (gloo).

The runs are shared by the tests of this module (module-scoped fixtures): a 2-rank FSDP run and
a 2-rank DDP run of the same tiny GPT-2 at micro-batch 2, with a checkpoint every 3 steps, are
the references for equivalence, memory, resume, crash and OOM recovery. Every launch has a
timeout, so a rank left in a collective fails the test instead of blocking the suite.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from app.engine.records.summary import Summary
from tests import procs
from tests.conftest import TINY
from tests.exit_threads import EXIT_LINE

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LAUNCH_TIMEOUT = 300  # seconds: a hang fails the test
# Two blocks (FSDP shards each), 16 samples per step (8 per rank), checkpoints at 3 and 6.
GPT2 = [
    *TINY,
    "model.n_layer=2",
    "training.effective_batch_size=16",
    "training.micro_batch_size=2",
    "training.checkpoint_every=3",
    "training.keep_checkpoints=3",
]


def torchrun(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m app.train ARGS` on 2 ranks (torchrun), one thread each, each rank saying which
    threads it leaves behind as it exits (tests/exit_threads.py)."""
    train = ["-m", "tests.exit_threads", *args, f"hydra.run.dir={run_dir}"]
    env = procs.environment(OMP_NUM_THREADS="1")
    return procs.run(
        [*procs.TORCHRUN, "--nproc_per_node=2", *train], env=env, timeout=LAUNCH_TIMEOUT
    )


def completed(proc: subprocess.CompletedProcess, run_dir: Path) -> Summary:
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = Summary.read(run_dir)
    assert summary.status == "completed"
    if "tests.exit_threads" in proc.args:
        # No rank leaves a gloo thread to the interpreter's finalization, where one that frees
        # a collective's tensor aborts the rank (SIGABRT) after the run has succeeded.
        # Found anywhere in a line: another rank's output may precede it on its line.
        exits = [chunk.split("\n")[0] for chunk in proc.stderr.split(EXIT_LINE)[1:]]
        assert len(exits) == 2, proc.stderr[-3000:]
        assert not [line for line in exits if "gloo" in line], exits
    return summary


def shards(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A sharded checkpoint's tensors (model and optimizer), whole, read in this process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = checkpoint.parent / f"{checkpoint.name}.whole.pt"
    dcp_to_torch_save(checkpoint, out)
    whole = torch.load(out, weights_only=True)
    out.unlink()
    flat: dict[str, torch.Tensor] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(whole, "")
    return flat


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def exported(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """Scratch space of the module, with the token data cache its runs share."""
    return tmp_path_factory.mktemp("fsdp")


def args(base: Path, *extra: str) -> list[str]:
    return [*GPT2, f"data.cache_dir={base / 'cache'}", *extra]


@pytest.fixture(scope="module")
def fsdp2(base) -> tuple[Path, Summary, str]:
    run_dir = base / "fsdp2"
    proc = torchrun(run_dir, *args(base, "training.parallelism=fsdp"))
    return run_dir, completed(proc, run_dir), proc.stdout


@pytest.fixture(scope="module")
def ddp2(base) -> tuple[Path, Summary]:
    run_dir = base / "ddp2"
    return run_dir, completed(torchrun(run_dir, *args(base)), run_dir)


@pytest.fixture(scope="module")
def single(base) -> tuple[Path, Summary]:
    run_dir = base / "single"
    proc = procs.train(*args(base), f"hydra.run.dir={run_dir}")
    return run_dir, completed(proc, run_dir)


# --- FSDP follows one process, at half the memory per rank --------------------------------


def test_fsdp_on_two_ranks_follows_one_process(fsdp2, single):
    (run_dir, summary, _), (one_dir, one) = fsdp2, single
    assert summary.world_size == 2 and summary.parallelism == "fsdp"
    # The same validation loss after 6 steps (float32 sums in another order: 1e-5).
    assert summary.final_val["loss"] == pytest.approx(one.final_val["loss"], rel=1e-5)
    mine, theirs = exported(run_dir), exported(one_dir)
    assert mine.keys() == theirs.keys()
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)


def test_fsdp_holds_half_the_model_state_of_ddp_per_rank(fsdp2, ddp2):
    (_, fsdp, banner), (_, ddp) = fsdp2, ddp2
    # Measured on each rank's tensors after the first optimizer step.
    for kind in ("parameters", "gradients", "optimizer", "total"):
        assert fsdp.model_state_bytes[kind] <= 0.55 * ddp.model_state_bytes[kind], kind
    assert max(fsdp.model_state_bytes_per_rank) <= 0.55 * min(ddp.model_state_bytes_per_rank)
    assert len(fsdp.peak_memory_bytes_per_rank) == 2
    assert "0.50x of a whole copy (fsdp over 2 ranks)" in banner


def test_the_export_of_an_fsdp_run_loads_with_transformers_and_generates(fsdp2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = fsdp2[0]
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    out = model.generate(**tokenizer("the", return_tensors="pt"), max_new_tokens=5)
    assert out.shape[1] > 1
    # The whole model rank 0 gathered: the shards of the last checkpoint, put together.
    final = shards(run_dir / "checkpoints" / "step_00000006")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, final[f"model.{name}"], rtol=0, atol=0, msg=name)


def test_fsdp_trains_the_classifier_as_one_process(base):
    nli = [
        "experiment=nli_tiny",
        "gpu=cpu",
        "data.builtin_num_docs=600",
        "data.max_length=64",
        "model.n_layer=2",
        "model.n_embd=32",
        "model.n_head=2",
        "model.intermediate_size=64",
        "training.effective_batch_size=8",
        "training.micro_batch_size=2",
        "training.max_steps=6",
        "training.eval_every=3",
        "training.eval_samples=16",
        "training.warmup_steps=2",
        "training.progress_bar=false",
        f"data.cache_dir={base / 'cache'}",
    ]
    one = completed(procs.train(*nli, f"hydra.run.dir={base / 'nli1'}"), base / "nli1")
    two = torchrun(base / "nli2", *nli, "training.parallelism=fsdp")
    fsdp = completed(two, base / "nli2")
    assert fsdp.final_val["loss"] == pytest.approx(one.final_val["loss"], rel=1e-5)
    assert fsdp.final_val["accuracy"] == one.final_val["accuracy"]
    assert fsdp.model_state_bytes["total"] <= 0.55 * one.model_state_bytes["total"]


def test_fsdp_with_activation_checkpointing_and_compile_follows_one_process(base, single):
    run_dir = base / "compiled"
    extra = ("training.parallelism=fsdp", "model.gradient_checkpointing=true", "model.compile=true")
    summary = completed(torchrun(run_dir, *args(base, *extra)), run_dir)
    assert summary.final_val["loss"] == pytest.approx(single[1].final_val["loss"], rel=1e-5)


# --- sharded checkpoints ------------------------------------------------------------------


def test_a_sharded_checkpoint_resumes_bit_identically_on_two_ranks(base, fsdp2):
    run_dir = fsdp2[0]
    assert (run_dir / "checkpoints" / "step_00000003" / "__1_0.distcp").is_file()  # rank 1's
    resumed = base / "resumed22"
    start = run_dir / "checkpoints" / "step_00000003"
    completed(
        torchrun(resumed, *args(base, "training.parallelism=fsdp", f"training.resume={start}")),
        resumed,
    )
    assert_identical(
        shards(resumed / "checkpoints" / "step_00000006"),
        shards(run_dir / "checkpoints" / "step_00000006"),
    )


def test_a_sharded_checkpoint_resumes_on_one_process_and_one_on_two(base, fsdp2):
    (run_dir, summary, _) = fsdp2
    start = run_dir / "checkpoints" / "step_00000003"
    one_dir = base / "resumed21"
    one = completed(
        procs.train(*args(base, f"training.resume={start}"), f"hydra.run.dir={one_dir}"), one_dir
    )
    assert one.resumed_from_step == 3 and one.steps == 6
    assert one.final_val["loss"] == pytest.approx(summary.final_val["loss"], rel=1e-4)
    # FSDP in one process writes sharded checkpoints (one shard); two ranks resume them.
    fsdp1 = base / "fsdp1"
    completed(
        procs.train(*args(base, "training.parallelism=fsdp"), f"hydra.run.dir={fsdp1}"), fsdp1
    )
    two_dir = base / "resumed12"
    resume = f"training.resume={fsdp1 / 'checkpoints' / 'step_00000003'}"
    two = completed(torchrun(two_dir, *args(base, "training.parallelism=fsdp", resume)), two_dir)
    assert two.resumed_from_step == 3
    assert two.final_val["loss"] == pytest.approx(summary.final_val["loss"], rel=1e-4)


def test_a_kill_during_a_sharded_write_leaves_the_previous_checkpoint_the_latest(base, fsdp2):
    run_dir = base / "killed"
    fsdp = ("training.parallelism=fsdp",)
    kill = ("faults.kill_in_checkpoint=6", "faults.kill_rank=1")
    proc = torchrun(run_dir, *args(base, *fsdp, *kill))
    assert proc.returncode != 0
    checkpoints = run_dir / "checkpoints"
    # Rank 1 died with its shard on disk; the checkpoint of step 6 never became one.
    assert (checkpoints / ".step_00000006.tmp" / "__1_0.distcp").is_file()
    assert not (checkpoints / "step_00000006").exists()
    from app.config.training import ResumeFrom
    from app.engine.saving import checkpoint as ckpt

    assert ckpt.find_resume_checkpoint(ResumeFrom(), run_dir) == checkpoints / "step_00000003"
    assert ckpt.load_checkpoint(checkpoints / "step_00000003").step == 3
    # The same command resumes from it and ends where the run that was not killed ended.
    completed(torchrun(run_dir, *args(base, *fsdp, "training.resume=auto")), run_dir)
    assert not list(checkpoints.glob(".step_*"))
    assert_identical(
        shards(checkpoints / "step_00000006"),
        shards(fsdp2[0] / "checkpoints" / "step_00000006"),
    )


# --- an OOM on one rank: every rank shrinks and redoes the step -----------------------------


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer"])
@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_an_oom_on_rank_1_alone_is_recovered_on_both_ranks(base, fsdp2, ddp2, parallelism, phase):
    """Micro-batch 4 until rank 1 runs out at step 2: both ranks halve to 2 and redo step 2
    from the same data, so the run ends as the run at micro-batch 2 from the start did."""
    run_dir = base / f"oom-{parallelism}-{phase}"
    fault = (
        "training.micro_batch_size=4",
        "faults.oom_above_micro_batch=2",
        "faults.oom_from_step=2",
        "faults.oom_rank=1",
        f"faults.oom_phase={phase}",
    )
    proc = torchrun(run_dir, *args(base, f"training.parallelism={parallelism}", *fault))
    summary = completed(proc, run_dir)
    assert summary.oom_count == 1 and summary.batch_source == "reduced_after_oom"
    assert summary.micro_batch_size == 2 and summary.effective_batch_size == 16
    # Both ranks shrank at the same step: each logged it.
    logged = proc.stdout + proc.stderr
    assert logged.count("OOM at step 2 with micro-batch 4: retrying the step with 2") == 2
    reference_dir, reference = (fsdp2[0], fsdp2[1]) if parallelism == "fsdp" else ddp2
    assert summary.final_val["loss"] == pytest.approx(reference.final_val["loss"], rel=1e-5)
    mine, theirs = exported(run_dir), exported(reference_dir)
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)


def test_with_recovery_off_an_oom_on_one_rank_ends_the_run(base):
    run_dir = base / "oom-off"
    fault = (
        "training.micro_batch_size=4",
        "training.auto_batch.oom_recovery=false",
        "faults.oom_above_micro_batch=2",
        "faults.oom_from_step=2",
        "faults.oom_rank=1",
    )
    proc = torchrun(run_dir, *args(base, *fault))
    assert proc.returncode != 0
    assert "out of memory at micro-batch 4 (step 2)" in proc.stderr
