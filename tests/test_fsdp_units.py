"""FSDP, sharded checkpoints and the OOM agreement, in this process: the plan every rank splits
alike, FSDP over a process group of one, the safe reading of a sharded checkpoint, and the
agreement's verdicts. The runs with 2 ranks are in tests/test_fsdp.py."""

from __future__ import annotations

import enum
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from app.config.training import ResumeFrom
from app.core.errors import ConfigError
from app.core.outcomes import TrainingOOM
from app.engine.batch_plan import BatchPlan, eval_padding, fixed_plan
from tests.conftest import TINY, config

pytestmark = pytest.mark.integration


def test_every_rank_runs_as_many_micro_batches_as_the_largest_share():
    # 9 samples over 2 ranks: shares 5 and 4.
    for micro in (1, 2, 3, 4, 5):
        plans = [fixed_plan(9, micro, 2, rank) for rank in (0, 1)]
        assert plans[0].micro_batch_size == plans[1].micro_batch_size
        counts = [len(p.micro_sizes) + p.padding for p in plans]
        assert counts[0] == counts[1] == plans[0].grad_accum_steps, micro
        for p in plans:
            assert sum(p.micro_sizes) == p.per_rank_batch
            assert max(p.micro_sizes) <= p.micro_batch_size
    assert fixed_plan(9, 2, 2, 1).micro_sizes == [2, 1, 1]  # 4 in 3, as rank 0's 5 is
    assert fixed_plan(9, 1, 2, 1).padding == 1  # 4 samples, 5 micro-batches: one at weight 0
    assert BatchPlan(32, 5).micro_sizes == [5, 5, 5, 5, 4, 4, 4]  # one process: as before


def test_evaluation_pads_the_smaller_share_to_the_same_number_of_micro_batches():
    # 11 validation samples over 2 ranks (6 and 5) at micro-batch 5: 2 and 1 micro-batches.
    assert eval_padding(6, 11, 2, 5) == 0
    assert eval_padding(5, 11, 2, 5) == 1
    assert eval_padding(0, 1, 2, 4) == 1  # a rank with no sample still takes part
    assert eval_padding(11, 11, 1, 5) == 0


def test_fsdp_in_one_process_trains_as_the_plain_run(tmp_path):
    from app.engine.runner import run_training

    base = [*TINY, "model.n_layer=2", f"data.cache_dir={tmp_path / 'cache'}"]
    plain = run_training(config(base), tmp_path / "plain")
    sharded = run_training(config([*base, "training.parallelism=fsdp"]), tmp_path / "fsdp")
    assert not dist.is_initialized()  # its process group of one is gone with the run
    assert sharded.final_val["loss"] == pytest.approx(plain.final_val["loss"], rel=1e-6)
    assert sharded.model_state_bytes == plain.model_state_bytes  # one rank: nothing sharded
    step = tmp_path / "fsdp" / "checkpoints" / "step_00000006"
    assert (step / "__0_0.distcp").is_file() and (step / "train_state.pt").is_file()
    from safetensors.torch import load_file

    a = load_file(tmp_path / "plain" / "model" / "model.safetensors")
    b = load_file(tmp_path / "fsdp" / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)


def _small_state(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    small = {"optimizer": {"param_groups": []}, "scheduler": {}, "step": 3, "rng": {}}
    torch.save(small, directory / "train_state.pt")


class Payload:
    """Code a checkpoint's index must never run: it would create `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_sharded_checkpoint_whose_index_holds_code_is_refused_without_running_it(tmp_path):
    from app.engine.saving import checkpoint as ckpt

    step = tmp_path / "checkpoints" / "step_00000003"
    _small_state(step)
    marker = tmp_path / "ran"
    (step / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    assert ckpt.find_resume_checkpoint(ResumeFrom(str(step)), tmp_path) == step
    with pytest.raises(ConfigError, match="is unreadable"):
        ckpt.load_checkpoint(step)
    assert not marker.exists()


class ByName(pickle.Pickler):
    """Pickles enum members as the CUDA wheels of torch do: `getattr(EnumClass, "NAME")`."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def _reindex(step: Path, pickler: type[pickle.Pickler], rewrite=lambda m: m) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = rewrite(FileSystemReader(step).read_metadata())
    with open(step / ".metadata", "wb") as f:
        pickler(f).dump(metadata)


def test_an_index_with_enum_members_by_name_loads(tmp_path):
    """A torch build that pickles the index's enum members by name (PyPI's CUDA wheels): its
    checkpoints resume, on a machine with either build."""
    import torch.distributed.checkpoint as dcp

    from app.engine.saving import sharded

    step = tmp_path / "step_00000003"
    dcp.save({"model": {"w": torch.arange(4.0)}}, checkpoint_id=step)
    _reindex(step, ByName)
    assert b"getattr" in (step / ".metadata").read_bytes()
    restored = {"model": {"w": torch.zeros(4)}}
    dcp.load(restored, storage_reader=sharded.SafeReader(step))
    torch.testing.assert_close(restored["model"]["w"], torch.arange(4.0))


def test_an_index_may_look_up_nothing_but_an_enum_member_by_name(tmp_path):
    """getattr in an index reaches an enum's member, never another attribute of a class the
    index may name (here torch.Size's constructor)."""
    from app.engine.saving import sharded

    class Attribute:
        def __reduce__(self):
            return getattr, (torch.Size, "__new__")

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Attribute()))
    with pytest.raises(pickle.UnpicklingError, match="not part of a checkpoint index"):
        sharded.SafeReader(tmp_path).read_metadata()


def test_a_sharded_checkpoint_holding_anything_but_tensors_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    from app.engine.saving import checkpoint as ckpt

    step = tmp_path / "step_00000003"
    # DCP stores a non-tensor as a pickle it would read back with torch.load(weights_only=False).
    dcp.save({"model": {"w": torch.ones(2)}, "extra": {"note": "text"}}, checkpoint_id=step)
    _small_state(step)
    with pytest.raises(ConfigError, match="is unreadable"):
        ckpt.load_checkpoint(step)


def test_fsdp_refuses_fp16_in_one_line():
    from app.components.hardware.precision import PrecisionPlan
    from app.engine.parallel.fsdp import check_precision

    fp16 = PrecisionPlan("fp16", torch.float16, True, False, "test")
    with pytest.raises(ConfigError, match=r"training\.parallelism=fsdp with precision=fp16") as exc:
        check_precision(fp16)
    assert "\n" not in str(exc.value)
    check_precision(PrecisionPlan("bf16", torch.bfloat16, False, True, "test"))


def test_fsdp_refuses_an_optimizer_that_cannot_step_shards():
    with pytest.raises(ConfigError, match=r"training\.optimizer=adafactor cannot step"):
        config([*TINY, "training.parallelism=fsdp", "training.optimizer=adafactor"])
    with pytest.raises(ConfigError, match=r"training\.parallelism='zero3' is not allowed"):
        config([*TINY, "training.parallelism=zero3"])


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_agreement_raises_on_every_rank_and_ends_the_run_inside_an_update(group_of_one):
    from app.config.training import FaultsConfig
    from app.engine.comms.agreement import AgreedOOM, Agreement
    from app.engine.faults import FaultInjector

    faults = FaultInjector(FaultsConfig(oom_above_micro_batch=2, oom_phase="backward"))
    agreement = Agreement(enabled=True)
    agreement.boundary(faults, "forward", 4, step=0)  # not this phase: agreed, nothing raised
    with pytest.raises(AgreedOOM, match="on rank 0"):
        agreement.boundary(faults, "backward", 4, step=0)
    agreement.settle(0, "updated")
    agreement.join(0)  # out of memory inside a forward: the step may be redone
    agreement.boundary(faults, "optimizer", 4, step=0)
    with pytest.raises(TrainingOOM, match="inside the optimizer update"):
        agreement.join(0)
    assert agreement.count == 6
    off = Agreement(enabled=False)  # one process: the fault as it is, no collective
    with pytest.raises(torch.OutOfMemoryError) as raised:
        off.boundary(faults, "backward", 4, step=0)
    assert not isinstance(raised.value, AgreedOOM)


@pytest.mark.parametrize("family", ["gpt2", "llama", "deberta-v2", "bert"])
def test_fsdp_finds_one_unit_per_transformer_block_in_every_family(family):
    """The blocks FSDP shards one by one: each family's list of hidden layers, nothing else."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from app.engine.parallel.fsdp import transformer_blocks

    size = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}
    if family == "gpt2":
        size = {"n_embd": 32, "n_head": 2}
    cfg = AutoConfig.for_model(family, num_hidden_layers=3, vocab_size=64, **size)
    if family in ("gpt2", "llama"):
        model = AutoModelForCausalLM.from_config(cfg)
    else:
        model = AutoModelForSequenceClassification.from_config(cfg)
    blocks = transformer_blocks(model)
    assert len(blocks) == 3
    names = {n for n, m in model.named_modules() if any(m is b for b in blocks)}
    assert all(n.rsplit(".", 1)[-1].isdigit() for n in names), names


def test_a_rank_that_cannot_meet_the_others_ends_as_an_oom(group_of_one, monkeypatch):
    """Out of memory inside one of FSDP's collectives: the others wait in it, not at a
    boundary, so the agreement's own collective fails (or times out). The rank that ran out
    ends as an OOM (a trial: pruned, reason oom), not as a distributed error."""
    import app.engine.comms.agreement as agreement_module
    from app.engine.comms.agreement import Agreement

    def peers_gone(*args, **kwargs):
        raise dist.DistBackendError("[gloo] Timed out waiting 1800000ms for recv operation")

    monkeypatch.setattr(agreement_module.dist, "all_reduce", peers_gone)
    agreement = Agreement(rank=1, enabled=True)
    agreement.phase = "forward"
    with pytest.raises(TrainingOOM, match=r"rank 1 inside forward \(step 3\).*DistBackendError"):
        agreement.join(3, "CUDA out of memory. Tried to allocate 2.00 GiB")


def test_an_evaluation_oom_with_recovery_off_ends_the_run(tmp_path):
    """No retry at a smaller evaluation micro-batch when recovery is off: under torchrun no
    rank agreed, and one evaluating again alone would meet its peers' collectives out of
    order."""
    from app.engine.runner import run_training

    faults = [
        "faults.oom_above_micro_batch=4",
        "faults.oom_phase=eval",
        "training.eval_micro_batch_size=8",
        "training.auto_batch.oom_recovery=false",
    ]
    cfg = config([*TINY, f"data.cache_dir={tmp_path / 'cache'}", *faults])
    with pytest.raises(TrainingOOM, match="in evaluation at micro-batch 8"):
        run_training(cfg, tmp_path / "run")


def test_a_step_written_again_replaces_its_checkpoint_whole_even_if_killed_between(
    tmp_path, monkeypatch
):
    """A checkpoint of a step an earlier attempt wrote is moved aside before the new one takes
    its name: a kill in between leaves no half-deleted directory under a checkpoint's name."""
    import os

    from app.engine.saving import checkpoint as ckpt
    from app.engine.saving import sharded as sharded

    checkpoints = tmp_path / "checkpoints"
    previous, final = checkpoints / "step_00000003", checkpoints / "step_00000006"
    for directory in (previous, final):
        _small_state(directory)
        (directory / sharded.INDEX_FILE).write_bytes(b"index")
    tmp = sharded.temporary(final)
    _small_state(tmp)
    (tmp / sharded.INDEX_FILE).write_bytes(b"new index")
    real_replace, calls = os.replace, []

    def killed_before_the_new_one_takes_its_name(src, dst):
        calls.append(Path(dst))
        if Path(dst) == final:
            raise KeyboardInterrupt("killed")
        real_replace(src, dst)

    monkeypatch.setattr(sharded.os, "replace", killed_before_the_new_one_takes_its_name)
    with pytest.raises(KeyboardInterrupt):
        sharded.finish(tmp, final, {"step": 6})
    assert final.with_name(".step_00000006.old") in calls  # the old copy went aside first
    assert ckpt.list_checkpoints(checkpoints) == [previous]  # the previous is the latest
    sharded.remove_temporaries(checkpoints)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000003"]
    monkeypatch.setattr(sharded.os, "replace", real_replace)
    _small_state(tmp)
    (tmp / sharded.INDEX_FILE).write_bytes(b"new index")
    _small_state(final)
    sharded.finish(tmp, final, {"step": 6})  # replaced, with nothing left aside
    assert (final / sharded.INDEX_FILE).read_bytes() == b"new index"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000003", "step_00000006"]
