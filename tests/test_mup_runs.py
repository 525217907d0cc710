"""μP runs through the trainer: the export transformers loads alone gives the trained model's
logits, a checkpoint records the parametrization (a resume continues the same trajectory, a
resume under another is refused), and accumulation and OOM recovery are unchanged by it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from app.components.tasks import build_task
from app.config import ConfigError
from app.core.outcomes import TrainingOOM
from app.engine.runner import run_training
from app.engine.saving import checkpoint as ckpt
from tests import procs
from tests.conftest import config, tiny, train_here

pytestmark = pytest.mark.integration

# TINY is width 32 with 2 heads; its hyperparameters stated at width 16. The logits' multiplier
# is output_mult / width_mult = 3 / 2: not 1, so an export that does not fold it is seen
MUP = ["model.parametrization=mup", "model.mup.base_width=16", "model.mup.output_mult=3"]


@pytest.fixture(scope="module")
def mup_run(tmp_path_factory) -> Path:
    """A completed μP run through the real entrypoint, exported."""
    base = tmp_path_factory.mktemp("mup")
    run = base / "run"
    # head width 16, its attention stated at head width 4: the scale 3 x 2 / 16 to fold
    heads = ["model.mup.base_head_dim=4", "model.mup.attn_mult=3"]
    train_here(*tiny(base), *MUP, *heads, f"hydra.run.dir={run}")
    return run


def _trained(run: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    """The run's μP model rebuilt from its config and final checkpoint, and validation inputs."""
    from app.cli.export import run_settings

    state = ckpt.load_checkpoint(ckpt.list_checkpoints(run / "checkpoints")[-1])
    settings = run_settings(run / "checkpoints", state)
    task = build_task(settings.task)
    data = task.load_data(settings.data)
    model = task.build_model(settings.model, data).eval()
    model.load_state_dict(state.model)
    inputs, _ = task.inputs_and_targets(data.val[:4])
    return model, inputs


def test_the_export_loads_in_transformers_and_gives_the_trained_models_logits(mup_run):
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(mup_run / "model").eval()
    model, inputs = _trained(mup_run)
    with torch.no_grad():
        want = model(input_ids=inputs).logits
        got = exported(input_ids=inputs).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    marker = json.loads((mup_run / "model" / "hydratrain_export.json").read_text())
    assert marker["trained_under"]["parametrization"] == "mup"
    assert marker["trained_under"]["base_width"] == 16
    assert marker["trained_under"]["base_head_dim"] == 4


LOGITS = """
import json, sys
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
ids = torch.tensor(json.loads(sys.argv[2]))
with torch.no_grad():
    logits = model(input_ids=ids).logits
print(json.dumps({"logits": logits.tolist(), "app": any(m.startswith("app") for m in sys.modules)}))
"""


@pytest.mark.e2e
def test_transformers_alone_gives_the_trained_logits(mup_run, tmp_path):
    """In a process that cannot import this project."""
    model, inputs = _trained(mup_run)
    env = {k: v for k, v in procs.environment().items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    ids = json.dumps(inputs[:2].tolist())
    proc = procs.run([procs.PY, "-c", LOGITS, mup_run / "model", ids], cwd=tmp_path, env=env)
    assert proc.returncode == 0, procs.failure(proc)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["app"]
    with torch.no_grad():
        want = model(input_ids=inputs[:2]).logits
    torch.testing.assert_close(torch.tensor(got["logits"]), want, atol=1e-5, rtol=1e-4)


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    return ckpt.load_checkpoint(ckpt.list_checkpoints(run_dir / "checkpoints")[-1]).model


def test_a_mup_run_stopped_and_resumed_continues_its_trajectory(tmp_path):
    base = tiny(tmp_path, *MUP, "training.checkpoint_every=3")
    straight = run_training(config(base), tmp_path / "straight")
    crash = [
        "faults.oom_above_micro_batch=0",
        "faults.oom_from_step=3",
        "training.auto_batch.oom_recovery=false",
    ]
    with pytest.raises(TrainingOOM):
        run_training(config([*base, *crash]), tmp_path / "first")
    resumed = run_training(
        config([*base, f"training.resume={tmp_path / 'first'}"]), tmp_path / "second"
    )
    assert resumed.resumed_from_step == 3
    a, b = _final(tmp_path / "straight"), _final(tmp_path / "second")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    assert resumed.final_val["loss"] == straight.final_val["loss"]
    saved = torch.load(ckpt.list_checkpoints(tmp_path / "second" / "checkpoints")[-1])
    assert saved["config"]["model"]["parametrization"] == "mup"  # what the checkpoint records
    assert saved["config"]["model"]["mup"]["base_width"] == 16


@pytest.mark.parametrize(
    ("first", "then", "needle"),
    [
        ([], MUP, "trained with model.parametrization=standard, this run has "
         "model.parametrization=mup"),
        (MUP, [], "trained with model.parametrization=mup, this run has "
         "model.parametrization=standard"),
        (MUP, [*MUP, "model.mup.base_width=8"], "trained with model.mup.base_width=16, this run "
         "has model.mup.base_width=8"),
        (MUP, [*MUP, "model.mup.base_head_dim=4"], "trained with model.mup.base_head_dim=null, "
         "this run has model.mup.base_head_dim=4"),
    ],
)  # fmt: skip
def test_a_resume_under_another_parametrization_is_refused(first, then, needle, tmp_path):
    run_training(config(tiny(tmp_path, *first, "training.max_steps=3")), tmp_path / "run")
    resume = f"training.resume={tmp_path / 'run'}"
    again = config(tiny(tmp_path, *then, resume, "training.max_steps=6"))
    with pytest.raises(ConfigError, match="resume with the same model") as refused:
        run_training(again, tmp_path / "next")
    assert needle in str(refused.value)


def test_a_checkpoint_from_before_the_base_head_width_resumes_at_its_old_attention_scale(tmp_path):
    """A μP checkpoint that does not record model.mup.base_head_dim was trained at
    attn_mult / d_head: a base head width of 1, which a resume must then set."""
    from app.engine.start_checks import check_resume_matches, model_identity

    old = model_identity(config(tiny(tmp_path, *MUP, "model.mup.base_head_dim=1")))
    del old["model"]["mup"]["base_head_dim"]  # type: ignore[index]
    with pytest.raises(ConfigError, match="resume with the same model") as refused:
        check_resume_matches(config(tiny(tmp_path, *MUP)), tmp_path / "step.pt", old)
    assert "trained with model.mup.base_head_dim=1, this run has model.mup.base_head_dim=null" in (
        str(refused.value)
    )
    same = config(tiny(tmp_path, *MUP, "model.mup.base_head_dim=1"))
    check_resume_matches(same, tmp_path / "step.pt", old)  # the old scale: accepted


def test_accumulation_and_oom_recovery_train_a_mup_model_as_one_micro_batch_does(tmp_path):
    whole = run_training(
        config(tiny(tmp_path, *MUP, "training.micro_batch_size=8")), tmp_path / "a"
    )
    split = run_training(
        config(tiny(tmp_path, *MUP, "training.micro_batch_size=2")), tmp_path / "b"
    )
    recovered = run_training(
        config(
            tiny(tmp_path, *MUP, "training.micro_batch_size=8", "faults.oom_above_micro_batch=2")
        ),
        tmp_path / "c",
    )
    assert recovered.batch_source == "reduced_after_oom" and recovered.micro_batch_size == 2
    for run in (split, recovered):
        assert run.final_val["loss"] == pytest.approx(whole.final_val["loss"], rel=1e-4)
    assert os.path.isdir(tmp_path / "c" / "checkpoints")


@pytest.mark.e2e
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_mup_on_two_ranks_follows_one_process(parallelism, tmp_path):
    """DDP and FSDP2 (torchrun, 2 ranks on CPU): the hidden groups' rates and the multipliers
    hold on the wrapped and the sharded model alike."""
    from tests.test_fsdp import GPT2, completed, exported, torchrun

    base = [*GPT2, *MUP, f"data.cache_dir={tmp_path / 'cache'}"]
    one = completed(procs.train(*base, f"hydra.run.dir={tmp_path / 'one'}"), tmp_path / "one")
    proc = torchrun(tmp_path / "two", *base, f"training.parallelism={parallelism}")
    two = completed(proc, tmp_path / "two")
    assert two.world_size == 2 and "mup        width 32 = 2 x base 16" in proc.stdout
    assert two.final_val["loss"] == pytest.approx(one.final_val["loss"], rel=1e-5)
    mine, theirs = exported(tmp_path / "two"), exported(tmp_path / "one")
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("optimizer", ["lion", "adafactor"])
def test_every_optimizer_trains_under_mup(optimizer, tmp_path):
    summary = run_training(
        config(tiny(tmp_path, *MUP, f"training={optimizer}", "training.eval_at_start=true")),
        tmp_path / "run",
    )
    assert summary.status == "completed"
    assert summary.final_val["loss"] < summary.initial_val["loss"]
