"""The transformers Trainer's own study, the peer of `python -m app.bench --hpo-peers`.

`Trainer.hyperparameter_search(backend="optuna")` on what the sweeper's study trains: the same
composed config (model, data blocks, steps, evaluation cadence and samples, optimizer recipe),
the same search space (`hydra.sweeper.params` of that config, under the Trainer's argument
names), the same sampler and seed (so both studies draw the same configurations in the same
order) and Optuna's SuccessiveHalvingPruner (the arguments the spec gives). Each step trains
the samples the sweeper's step trains, in the same order (the trainer's step order, fed through
the Trainer's train sampler), so the two differ by framework, not by data luck. The study is
written to a journal file the parent reads back.

Run as `python -m app.bench.hf_study <spec.json>`; transformers is imported only here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

# The sweeper's names -> TrainingArguments fields. The effective batch becomes accumulation
# steps of the fixed micro-batch (its choices divided by the micro-batch: same draws).
ARGUMENT = {
    "training.effective_batch_size": "gradient_accumulation_steps",
    "training.lr": "learning_rate",
    "training.weight_decay": "weight_decay",
    "training.warmup_steps": "warmup_steps",
}


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from app.config.compose import compose
    from app.config.schema import load_config

    composed = compose("train", spec["overrides"], return_hydra_config=True)
    space = _space(composed.hydra.sweeper.params)
    cfg = load_config(compose("train", spec["overrides"]))
    micro = cfg.training.fixed_micro_batch
    if micro is None:
        raise SystemExit("the study bench needs a fixed training.micro_batch_size")
    trainer = _trainer(cfg, spec["tmp"])
    storage = optuna.storages.JournalStorage(JournalFileBackend(spec["journal"]))
    trainer.hyperparameter_search(
        hp_space=lambda trial: _suggest(trial, space, micro),
        backend="optuna",
        n_trials=spec["n_trials"],
        direction="minimize",
        study_name="peer",
        storage=storage,
        sampler=optuna.samplers.RandomSampler(seed=spec["seed"]),
        pruner=optuna.pruners.SuccessiveHalvingPruner(**spec["pruner_args"]),
    )
    return 0


def _space(params: Any) -> dict[str, Any]:
    """The sweep's search space as Optuna distributions, parsed as the sweeper parses it."""
    from omegaconf import OmegaConf

    from hydra_plugins.hydratrain_optuna_sweeper.pruning import search_space

    plain: dict[str, Any] = OmegaConf.to_container(params, resolve=True)  # type: ignore[assignment]
    space = search_space(plain)
    unknown = set(space) - set(ARGUMENT)
    if unknown:
        raise SystemExit(f"hf_study: no TrainingArguments field for {sorted(unknown)}")
    return space


def _suggest(trial: Any, space: dict[str, Any], micro: int) -> dict[str, Any]:
    """Suggest in the sweeper's order and with its distributions, under the Trainer's names."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    out = {}
    for name, dist in space.items():
        arg = ARGUMENT[name]
        if name == "training.effective_batch_size":
            out[arg] = trial.suggest_categorical(arg, [c // micro for c in dist.choices])
        elif isinstance(dist, CategoricalDistribution):
            out[arg] = trial.suggest_categorical(arg, list(dist.choices))
        elif isinstance(dist, FloatDistribution):
            out[arg] = trial.suggest_float(arg, dist.low, dist.high, log=dist.log, step=dist.step)
        else:
            step = 1 if dist.log else dist.step
            out[arg] = trial.suggest_int(arg, dist.low, dist.high, log=dist.log, step=step)
    return out


def _trainer(cfg: Any, tmp: str) -> Any:
    from transformers import Trainer, TrainingArguments

    from app.bench.tasks import _HfBlocks
    from app.components.data.loader import StepDataset
    from app.components.tasks import build_task

    task = build_task(cfg.task)
    data = task.load_data(cfg.data)
    t = cfg.training

    class StepOrderTrainer(Trainer):
        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            n = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
            order = StepDataset(data.train, n, cfg.data.seed)
            return torch.cat([order.step_indices(s) for s in range(t.max_steps)]).tolist()

    def model_init(trial: Any = None) -> Any:
        return task.build_model(cfg.model, data)  # seeded by the Trainer with args.seed

    args = TrainingArguments(
        output_dir=str(Path(tmp) / "hf"),
        per_device_train_batch_size=t.micro_batch_size,
        per_device_eval_batch_size=4 * t.micro_batch_size,  # the sweep's eval micro-batch
        max_steps=t.max_steps,
        eval_strategy="steps",
        eval_steps=t.eval_every,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        adam_epsilon=t.eps,
        max_grad_norm=t.max_grad_norm,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": t.min_lr_ratio},
        use_cpu=cfg.gpu.device_type == "cpu" or not torch.cuda.is_available(),
        dataloader_drop_last=True,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=t.seed,
        remove_unused_columns=False,
    )
    return StepOrderTrainer(
        model_init=model_init,
        args=args,
        train_dataset=_HfBlocks(data.train),
        eval_dataset=_HfBlocks(data.val[: t.eval_samples]),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
