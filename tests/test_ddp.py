"""torchrun + DDP on CPU (gloo): two ranks train the same trajectory as one process."""

from __future__ import annotations

import pytest
import torch

from app.components.tasks.causal_lm import CausalLM
from app.engine.records.summary import Summary
from app.engine.saving import checkpoint as ckpt
from tests import procs
from tests.conftest import tiny

pytestmark = pytest.mark.e2e


@pytest.mark.slow
def test_two_ranks_match_one_process(tmp_path):
    # Effective batch 9 over 2 ranks: shares 5 and 4, micro-batch 2 -> uneven splits on both.
    args = tiny(
        tmp_path,
        "training.effective_batch_size=9",
        "training.micro_batch_size=2",
        "training.max_steps=4",
        "training.eval_every=2",
    )
    single = procs.train(*args, f"hydra.run.dir={tmp_path / 'single'}")
    assert single.returncode == 0, single.stderr[-2000:]
    ranks = [*procs.TORCHRUN, "--nproc_per_node=2", "-m", "app.train", *args]
    env = procs.environment(OMP_NUM_THREADS="1")
    procs.run([*ranks, f"hydra.run.dir={tmp_path / 'ddp'}"], env=env, timeout=600, check=True)
    summary = Summary.read(tmp_path / "ddp")
    assert summary.world_size == 2 and summary.effective_batch_size == 9
    assert summary.status == "completed"
    a = torch.load(
        ckpt.list_checkpoints(tmp_path / "single" / "checkpoints")[-1], weights_only=True
    )["model"]
    b = torch.load(ckpt.list_checkpoints(tmp_path / "ddp" / "checkpoints")[-1], weights_only=True)[
        "model"
    ]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)
    # Rank 0 exported the plain model (no DDP `module.` names), once, nothing left beside it.
    from safetensors.torch import load_file

    exported = load_file(tmp_path / "ddp" / "model" / "model.safetensors")
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, b[name], rtol=0, atol=0, msg=name)
    assert not list((tmp_path / "ddp").glob(".model.*"))


class EvalSizes(CausalLM):
    """Records the size of every evaluation micro-batch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def eval_sums(self, model, inputs, targets):
        self.seen.append(len(inputs))
        return super().eval_sums(model, inputs, targets)


def test_each_rank_evaluates_its_share_and_the_sums_make_the_whole():
    """Evaluation under DDP: rank r sees only its share of the validation blocks; the summed
    (loss, tokens) over ranks give the single-process validation loss (to float32 rounding:
    the batches are cut differently)."""
    from app.engine.comms.distributed import DistInfo
    from app.engine.train.evaluation import evaluate, local_sums
    from tests.test_accumulation import _run, _tiny_model_and_blocks

    model, blocks = _tiny_model_and_blocks()
    run = _run(model, micro=4, optimizer_kind="sgd")
    run.val_blocks = blocks[:11]  # odd: shares of 6 and 5 blocks, so 2 batches on each rank
    whole = evaluate(run, step=0)

    run.task = EvalSizes()
    sums = []
    for rank in (0, 1):
        run.dist = DistInfo(rank=rank, world_size=2)
        sums.append(local_sums(run, step=0))
    assert run.task.seen == [4, 2, 4, 1]  # rank 0: blocks 0-5, rank 1: blocks 6-10
    loss, count = (sums[0] + sums[1]).tolist()
    assert count == int((blocks[:11, 1:] != -100).sum())
    assert loss / count == pytest.approx(whole, rel=1e-6)


# An OOM on one rank under torchrun: recovered on every rank (tests/test_fsdp.py, DDP and FSDP).
