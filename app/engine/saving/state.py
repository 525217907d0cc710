"""A run's state in and out of its checkpoint (the record: TrainState, in
app/engine/saving/checkpoint.py).

One process and DDP: rank 0 writes one file. FSDP: every rank writes its shards into one
directory (app/engine/saving/sharded.py). Either kind resumes into either parallelism."""

from __future__ import annotations

from pathlib import Path

from app.engine.comms.distributed import agree_all, barrier
from app.engine.run import Run
from app.engine.saving import checkpoint as ckpt
from app.engine.saving import sharded as sharded
from app.engine.saving.checkpoint import TrainState


def capture(run: Run, step: int) -> TrainState:
    state = capture_small(run, step)
    state.model = run.raw_model.state_dict()
    state.optimizer = run.optimizer.state_dict()
    return state


def save(run: Run, step: int) -> None:
    if run.dist.sharded:
        save_sharded(run, step)
        return
    if not run.dist.is_main:
        return
    ckpt.save_checkpoint(
        run.run_dir / "checkpoints", step, capture(run, step), run.cfg.keep_checkpoints
    )


def save_sharded(run: Run, step: int) -> None:
    """Every rank writes its shards; rank 0 completes the checkpoint. Raises WriteFailed on
    every rank when any part failed (the earlier checkpoints intact)."""
    from torch.distributed.checkpoint.api import CheckpointException

    from app.core.outcomes import WriteFailed

    directory = run.run_dir / "checkpoints"
    final = ckpt.checkpoint_dir(directory, step)
    tmp = sharded.temporary(final)
    if run.dist.is_main:
        ckpt.remove_stale_temporaries(directory)
    barrier(run.dist)  # nobody writes into a temporary that is being removed
    error: BaseException | None = None
    try:  # DCP gathers every rank's failure and raises it on all of them
        kill = run.faults.kills_in_checkpoint(step)
        groups = sharded.write_shards(run.raw_model, run.optimizer, tmp, kill)
        if run.dist.is_main:
            sharded.finish(tmp, final, small_state(run, step, groups))
            ckpt.drop_old(directory, run.cfg.keep_checkpoints)
    except (OSError, RuntimeError, CheckpointException) as exc:
        error = exc
    if not agree_all(error is None, run.dist):
        why = ckpt.first_reason(error, directory) if error else "another rank failed"
        raise WriteFailed(
            f"could not write checkpoint {final} ({why}); the earlier checkpoints are intact"
        )


def small_state(run: Run, step: int, groups: list) -> dict:
    """What a sharded checkpoint keeps beside its shards: the TrainState without the tensors
    of the model and the optimizer (their hyperparameters stay)."""
    state = capture_small(run, step)
    state.optimizer = {"param_groups": groups}
    out = state.as_dict()
    out.pop("model")
    out.pop("shards")
    return out


def capture_small(run: Run, step: int) -> TrainState:
    """Everything but the model's and the optimizer's tensors."""
    return TrainState(
        model={},
        scheduler=run.scheduler.state_dict(),
        step=step,
        rng=ckpt.rng_state(),
        scaler=run.scaler.state_dict() if run.scaler else {},
        plan=run.plan.as_dict(),
        noise=run.noise.state_dict() if run.noise is not None else {},
        batch_schedule=dict(run.growth.state_dict(run.budget)) if run.growth is not None else {},
        config=run.facts.identity,
        tokenizer_sha256=run.facts.tokenizer,
    )


def restore(run: Run, state: TrainState) -> None:
    if state.shards is not None:
        groups = state.optimizer["param_groups"]
        sharded.load_shards(run.raw_model, run.optimizer, Path(state.shards), groups)
    elif run.dist.sharded:
        from app.engine.parallel.fsdp import load_whole_state

        load_whole_state(run.raw_model, run.optimizer, state.model, state.optimizer)
    else:
        run.raw_model.load_state_dict(state.model)
        run.optimizer.load_state_dict(state.optimizer)
    run.scheduler.load_state_dict(state.scheduler)
    if run.scaler is not None and state.scaler:
        run.scaler.load_state_dict(state.scaler)
    if run.noise is not None and state.noise:
        run.noise.load_state_dict(state.noise)
    if run.growth is not None and state.batch_schedule:
        run.growth.load_state_dict(state.batch_schedule)
    ckpt.set_rng_state(state.rng)
    run.start_step = int(state.step)
