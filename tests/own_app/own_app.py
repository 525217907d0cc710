"""An app of one's own under this sweeper: any `@hydra.main` app, no hpo node, no trainer.

It reports a validation loss every `every` steps (and at its last) and prunes itself when the
study's pruner says so, as a user's own training script would. Its loss falls with the steps
and is lowest at x = 2.
"""

import hydra
import optuna
from omegaconf import DictConfig

from hydra_plugins.hydratrain_optuna_sweeper.reporter import reporter_for_job


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg: DictConfig) -> float:
    rep = reporter_for_job(cfg)
    for step in range(1, cfg.steps + 1):
        val_loss = (cfg.x - 2.0) ** 2 + 10.0 / step
        if step % cfg.every and step < cfg.steps:
            continue
        if rep.report(step, {"val_loss": val_loss}):
            raise optuna.TrialPruned()
    return val_loss


if __name__ == "__main__":
    main()
