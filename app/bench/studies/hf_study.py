"""The transformers Trainer's own study, the peer of `python -m app.bench --hpo-peers` and
`--default-study`.

`Trainer.hyperparameter_search(backend="optuna")` on what the sweeper's study trains: the same
composed config (model, data blocks, evaluation samples, optimizer recipe), the same search
space (the study's `hydra.sweeper.params`, else its `hpo.params`, under the Trainer's argument
names), and the sampler and pruner the spec names. Each step trains the samples the sweeper's
step trains, in the same order (the trainer's step order, fed through the Trainer's train
sampler), so the two differ by framework, not by data luck. The study is written to a journal
file the parent reads back.

Two budgets, as the sweeper's study has them:

- steps (`--hpo-peers`): every trial trains `training.max_steps` steps of a fixed micro-batch,
  its effective batch as gradient accumulation (the sweeper's draws, in its order);
- data (`--default-study`, the spec's `samples`): every trial trains that many samples, its
  steps, warm-up and evaluations set per trial from its batch (the Trainer counts them in its
  own steps), the whole batch per step (no accumulation: on a CPU it fits).

Run as `python -m app.bench.studies.hf_study <spec.json>`; transformers is imported only here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

# The sweeper's names -> TrainingArguments fields. The effective batch becomes accumulation
# steps of the fixed micro-batch (its choices divided by the micro-batch: same draws), or under
# a data budget the per-device batch itself.
ARGUMENT = {
    "training.effective_batch_size": "gradient_accumulation_steps",
    "training.lr": "learning_rate",
    "training.weight_decay": "weight_decay",
    "training.warmup_steps": "warmup_steps",
}
BATCH = "training.effective_batch_size"


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import optuna
    from optuna.storages.journal import JournalFileBackend

    from app.config.compose import compose
    from app.config.schema import load_config

    composed = compose("train", spec["overrides"], return_hydra_config=True)
    space = _space(composed.hydra.sweeper.params or composed.hpo.params)
    cfg = load_config(compose("train", spec["overrides"]))
    samples = spec.get("samples")
    micro = cfg.training.fixed_micro_batch
    if micro is None and samples is None:
        raise SystemExit("the study bench needs a fixed training.micro_batch_size")
    trainer = _trainer(cfg, spec["tmp"], data_budget=samples is not None)

    def hp_space(trial: Any) -> dict[str, Any]:
        if samples is None:
            assert micro is not None  # checked above
            return _suggest(trial, space, micro)
        return _per_trial(trial, space, samples, cfg.training)

    storage = optuna.storages.JournalStorage(JournalFileBackend(spec["journal"]))
    trainer.hyperparameter_search(
        hp_space=hp_space,
        backend="optuna",
        n_trials=spec["n_trials"],
        direction="minimize",
        study_name="peer",
        storage=storage,
        sampler=_sampler(spec),
        pruner=_pruner(spec),
    )
    return 0


def _sampler(spec: dict[str, Any]) -> Any:
    import optuna

    if spec.get("sampler", "random") == "tpe":  # what hyperparameter_search builds, seeded
        return optuna.samplers.TPESampler(seed=spec["seed"])
    return optuna.samplers.RandomSampler(seed=spec["seed"])


def _pruner(spec: dict[str, Any]) -> Any:
    import optuna

    if spec.get("pruner") == "median":  # Optuna's default, what hyperparameter_search gets
        return optuna.pruners.MedianPruner()
    return optuna.pruners.SuccessiveHalvingPruner(**spec["pruner_args"])


def _per_trial(trial: Any, space: dict[str, Any], samples: int, t: Any) -> dict[str, Any]:
    """A trial under a data budget: its draws, and its steps, warm-up and evaluation interval in
    its own steps, as the sweeper's run derives them (reference-batch steps of data)."""
    from hydra_plugins.hydratrain_optuna_sweeper.pruning import suggest

    drawn = {name: suggest(trial, name, dist) for name, dist in space.items()}
    batch = int(drawn.pop(BATCH, t.effective_batch_size))
    per_step = t.reference_batch / batch  # this trial's steps per reference step
    warmup = int(drawn.pop("training.warmup_steps", t.warmup_steps))
    out = {ARGUMENT[name]: value for name, value in drawn.items()}
    return {
        **out,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": 1,
        "max_steps": -(-samples // batch),
        "warmup_steps": round(warmup * per_step),
        "eval_steps": max(1, round(t.eval_every * per_step)),
    }


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


def _trainer(cfg: Any, tmp: str, data_budget: bool = False) -> Any:
    from transformers import Trainer, TrainingArguments

    from app.bench.throughput.tasks import _HfBlocks
    from app.components.data.loader import StepDataset
    from app.components.tasks import build_task

    task = build_task(cfg.task)
    data = task.load_data(cfg.data)
    t = cfg.training

    class StepOrderTrainer(Trainer):
        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            n = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
            order = StepDataset(data.train, n, cfg.data.seed)
            steps = self.args.max_steps  # the trial's own under a data budget
            return torch.cat([order.step_indices(s) for s in range(steps)]).tolist()

    def model_init(trial: Any = None) -> Any:
        return task.build_model(cfg.model, data)  # seeded by the Trainer with args.seed

    # the sweep's evaluation micro-batch (none of it dropped: drop_last is for training)
    eval_batch = min(128, t.eval_samples) if data_budget else 4 * t.micro_batch_size
    args = TrainingArguments(
        output_dir=str(Path(tmp) / "hf"),
        per_device_train_batch_size=t.fixed_micro_batch or t.effective_batch_size,
        per_device_eval_batch_size=eval_batch,
        max_steps=t.max_steps or 1,  # under a data budget: set per trial
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
