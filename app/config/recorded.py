"""The config a checkpoint was trained with: what a resume is checked against and what the export
rebuilds its model from."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf


def saved_run_config(
    checkpoint: Path, recorded: dict[str, object] | None
) -> dict[str, object] | None:
    """The config the checkpoint records (`recorded`, its TrainState.config), else the one its
    run's .hydra/ holds (checkpoints from before they recorded it); None when neither does."""
    if isinstance(recorded, dict):
        return recorded
    hydra_cfg = checkpoint.parent.parent / ".hydra" / "config.yaml"
    if not hydra_cfg.is_file():
        return None
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(hydra_cfg), resolve=False)
    except Exception:  # a damaged file: as good as none
        return None
    return {str(k): v for k, v in loaded.items()} if isinstance(loaded, dict) else None
