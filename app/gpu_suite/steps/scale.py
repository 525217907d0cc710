"""Step 8: more than one GPU (DDP with NCCL, FSDP where the trainer has it), an Optuna study
of GPT-2 small, and a worker fleet where the sweeper has `hpo.workers`.

Settings that may not exist yet are detected through the trainer's own check of a command
line (`--cfg job`: exit status 2 and "no such setting" when the key is unknown)."""

from __future__ import annotations

import shutil

from app.gpu_suite import readers
from app.gpu_suite.context import StepContext
from app.gpu_suite.report import CommandRecord
from app.gpu_suite.steps.common import (
    EAGER,
    GPT2,
    GPT2_TINY,
    QUIET,
    TINY,
    Overrides,
    args,
    completed,
    loss_fell,
)

DDP: Overrides = {
    "gpu": "auto",
    **EAGER,
    "training.effective_batch_size": 64,
    "training.micro_batch_size": 8,
    "training.max_steps": 100,
    "training.checkpoint_every": 0,
    "training.export": "false",
}
STUDY_TRIALS, STUDY_TINY_TRIALS = 4, 2
STUDY: Overrides = {
    **GPT2,
    "hpo.n_trials": STUDY_TRIALS,
    "training.max_steps": 40,
    "training.eval_every": 10,
    "training.eval_samples": 32,
    "training.warmup_steps": 5,
    "hydra.sweeper.params": "{training.effective_batch_size:'choice(16, 32)',"
    "training.lr:'tag(log, interval(1e-4, 1e-3))'}",
}
STUDY_TINY: Overrides = {
    **GPT2_TINY,
    "hpo.n_trials": STUDY_TINY_TRIALS,
    "hydra.sweeper.params": "{training.effective_batch_size:'choice(8, 16)'}",
}


def scale(ctx: StepContext) -> None:
    ddp(ctx, "ddp", {})
    fsdp = exists(ctx, "training.parallelism=fsdp")
    if fsdp is None:
        ddp(ctx, "fsdp", {"training.parallelism": "fsdp"})
    else:
        ctx.skip("fsdp", torchrun(ctx, "fsdp", {"training.parallelism": "fsdp"}), fsdp)
    study(ctx, "study", {})
    workers = exists(ctx, "hpo=optuna", "hpo.workers=auto")
    if workers is None:
        study(ctx, "workers", {"hpo.workers": "auto"})
    else:
        ctx.skip(
            "worker fleet", study_argv(ctx, "workers", {"hpo.workers": "auto"}, STUDY), workers
        )


def exists(ctx: StepContext, *overrides: str) -> str | None:
    """None when the trainer accepts the setting, else why the command using it is skipped."""
    argv = ctx.py("-m", "app.train", "--cfg", "job", *overrides)
    rec = ctx.sh(
        f"is there {overrides[-1]}?", argv, dry=argv, limit_s=30, ok_rcs=(0, 2), needs_gpus=0
    )
    if rec.status != "ok" or rec.rc == 0:
        return None if rec.rc == 0 else f"the check of {overrides[-1]} did not finish"
    line = next((t for t in log_lines(ctx, rec) if t.startswith("error:")), "error: ?")
    return f"not in this version of the trainer ({line})"


def log_lines(ctx: StepContext, rec: CommandRecord) -> list[str]:
    return (ctx.suite.out / str(rec.log)).read_text(errors="replace").splitlines()


def torchrun(ctx: StepContext, run: str, extra: Overrides) -> list[str]:
    n = max(ctx.gpus, 2)
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    common: Overrides = {**QUIET, "hydra.run.dir": ctx.dir / run}
    return ctx.py(*launcher, "-m", "app.train", *args({**DDP, **extra, **common}))


def ddp(ctx: StepContext, run: str, extra: Overrides) -> None:
    argv = torchrun(ctx, run, extra)
    if ctx.sh(run, argv, limit_s=90, needs_gpus=2).status != "ok":
        return
    with ctx.reading(f"the {run} run"):
        s = readers.summary(ctx.dir / run)
        ctx.figure(f"{run}: world_size", s.world_size)
        ctx.figure(f"{run}: tokens_per_sec", s.tokens_per_sec)
        completed(ctx, s, run)
        loss_fell(ctx, s, run)
        ctx.check(f"{run}: one rank per GPU", s.world_size == ctx.gpus, f"{s.world_size}")


def study_argv(ctx: StepContext, name: str, extra: Overrides, sizes: Overrides) -> list[str]:
    where: Overrides = {
        "hpo.study_name": f"gpu_suite_{name}",
        "hpo.storage": ctx.dir / f"{name}.journal",
        "hydra.sweep.dir": ctx.dir / name,
    }
    return ctx.py(
        "-m", "app.train", "-m", "hpo=optuna", *args({**sizes, **extra, **where, **QUIET})
    )


def study(ctx: StepContext, name: str, extra: Overrides) -> None:
    shutil.rmtree(ctx.dir / name, ignore_errors=True)  # a study starts afresh in a rerun
    (ctx.dir / f"{name}.journal").unlink(missing_ok=True)
    gpu = study_argv(ctx, name, extra, STUDY)
    dry = study_argv(ctx, name, extra, {**STUDY, **TINY, **STUDY_TINY})
    if ctx.sh(f"{name}: -m hpo=optuna", gpu, dry=dry, limit_s=170).status != "ok":
        return
    with ctx.reading(f"the {name} study"):
        trials = readers.trial_summaries(ctx.dir / name)
        states = [t.status for t in trials]
        ctx.figure(f"{name}: trial statuses", states)
        ctx.figure(f"{name}: micro-batches", [t.micro_batch_size for t in trials])
        done = [t.final_val.get("loss") for t in trials if t.status == "completed"]
        losses = [loss for loss in done if loss is not None]
        ctx.figure(f"{name}: best final_val_loss", min(losses) if losses else None)
        rates = [t.tokens_per_sec for t in trials if t.tokens_per_sec]
        ctx.figure(f"{name}: median tokens/s", readers.median(rates))
        want = STUDY_TINY_TRIALS if ctx.dry else STUDY_TRIALS
        ctx.check(f"{name}: every trial ran", len(trials) == want, f"{len(trials)} of {want}")
        ctx.check(f"{name}: a trial completed", "completed" in states)
        ctx.check(
            f"{name}: results written", (ctx.dir / name / "optimization_results.yaml").is_file()
        )
