"""A run's state in and out of its checkpoint (the record: app/engine/checkpoint.py TrainState)."""

from __future__ import annotations

from app.engine import checkpoint as ckpt
from app.engine.checkpoint import TrainState
from app.engine.run import Run


def capture(run: Run, step: int) -> TrainState:
    return TrainState(
        model=run.raw_model.state_dict(),
        optimizer=run.optimizer.state_dict(),
        scheduler=run.scheduler.state_dict(),
        step=step,
        rng=ckpt.rng_state(),
        scaler=run.scaler.state_dict() if run.scaler else {},
        plan=run.plan.as_dict(),
        config=run.facts.identity,
        tokenizer_sha256=run.facts.tokenizer,
    )


def save(run: Run, step: int) -> None:
    if not run.dist.is_main:
        return
    ckpt.save_checkpoint(
        run.run_dir / "checkpoints", step, capture(run, step), run.cfg.keep_checkpoints
    )


def restore(run: Run, state: TrainState) -> None:
    run.raw_model.load_state_dict(state.model)
    run.optimizer.load_state_dict(state.optimizer)
    run.scheduler.load_state_dict(state.scheduler)
    if run.scaler is not None and state.scaler:
        run.scaler.load_state_dict(state.scaler)
    ckpt.set_rng_state(state.rng)
    run.start_step = int(state.step)
