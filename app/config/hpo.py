"""Schema of the `hpo` group: the settings of `-m hpo=optuna`, one default each.

The sweeper (hydra_plugins/hydratrain_optuna_sweeper) reads them; the trial a job reports to
is named by the sweeper in `trial_number` and `reporter`. conf/hpo/optuna.yaml sets only what
differs from these defaults. docs/hpo.md says what each one means next
to the stock sweeper's `hydra.sweeper.*` keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchSizeStudyConfig:
    """hpo.batch_size_study (sweeps/batch_size.yaml): after the sweep, per effective batch the
    steps and samples its best learning rate took to reach target_loss, and the critical batch
    size (app/studies/batch_size.py), in optimization_results.yaml and batch_size_study.png."""

    # null: the lowest loss that three batch sizes reach before the end of their runs
    target_loss: float | None = None


@dataclass
class WarmStartConfig:
    """hpo.warm_start: start the study from earlier ones (docs/hpo.md, "Warm start").

    `studies`: each a mapping {storage: a path or URL, study_name: NAME}, or {sweep_dir: DIR}
    (a sweep's directory: its optimization_results.yaml names the study, its study.journal
    holds it). `take`: enqueue (their best `top_k` configurations run first, mapped into this
    space) or observe (their finished trials shown to the sampler, not run, not counted toward
    the budget); `rungs`: observed trials bring their reports, for the pruner to compare at
    equal data (only for the same task and data)."""

    studies: list[Any] = field(default_factory=list)  # empty: a cold start
    take: str = "enqueue"
    top_k: int = 5
    rungs: bool = False
    # Take values from a study of another parametrization (standard vs μP, or μP at another
    # base width), where the same learning rate is another rate: refused unless set
    across_parametrizations: bool = False


@dataclass
class TransferConfig:
    """hpo.transfer: a study on a proxy that tunes a target (μP; docs/hpo.md, "A proxy study
    and its target"). `target`: the overrides that make the proxy the target (e.g.
    [model.n_embd=1024, model.n_head=16]); the study's first lines, its report and
    optimization_results.yaml give the command that trains it with the best configuration.
    `run`: once the study ends, the sweep runs that command (in <sweep dir>/target)."""

    target: list[str] = field(default_factory=list)
    run: bool = False


@dataclass
class HpoConfig:
    """A field that takes a value or a list (direction, metric), a number or a word (workers,
    trials_per_gpu), or a mapping the command line may extend is left untyped: OmegaConf 2.3
    takes no Union but Optional. The sweeper narrows each into a typed value where it reads
    the settings (`_settings.read_settings`, `_fleet_plan.FleetAsk`); nothing downstream sees
    them raw."""

    study_name: str = "hydratrain"
    # A path: an Optuna journal file; a URL (postgresql://..., sqlite:///...): an RDB storage;
    # null: <hydra.sweep.dir>/study.journal. `${oc.env:VAR}` keeps a password out of files.
    storage: str | None = None
    # The study's budget, study-wide (a rerun continues toward it). budget_trials: training
    # worth this many full trials: a trial stopped early spends only the data it trained on,
    # so what the pruner saves buys more trials (hpo._study.TrialsWorth counts it). n_trials,
    # when set: a count of trials instead (budget_trials then does not apply).
    budget_trials: float = 20.0
    n_trials: int | None = None
    # A full trial's resource and the interval its reports come at, in the app's own unit (the
    # step it passes to `report`), for an app whose config declares no training schedule
    # (training.max_steps, training.eval_every); a training run's config declares both. null:
    # learned from the first trial that completes (its last reported step, and the interval
    # of its reports), as Optuna's HyperbandPruner(max_resource="auto") learns it.
    max_resource: int | None = None
    report_every: int | None = None
    # minimize | maximize, or one per metric; null: each metric's own (loss down, tokens/s up)
    direction: Any = None
    metric: Any = "final_val_loss"  # summary.json key(s) the study optimizes
    # Reported at each evaluation; the pruner judges it, for several objectives too
    report_metric: str = "val_loss"
    sampler: str = "tpe"  # an option of hydra/sweeper/sampler: tpe, random, cmaes, nsgaii, ...
    # Mappings, typed Any with null for none: `hpo.sampler_args={population_size: 10}` on the
    # command line then sets keys that are not there yet (Hydra refuses new keys in a dict).
    sampler_args: Any = None  # fields of that sampler config
    seed: int | None = 0  # the sampler's seed unless sampler_args sets one
    # a module of hydra_plugins/.../_pruners/ (successive_halving, asha, ...); the defaults
    # follow the study's evaluations (_kind.py); measured: docs/benchmarks.md
    pruner: str = "successive_halving"
    pruner_args: Any = None  # arguments of the Optuna pruner (asha: reduction_factor, min_resource)
    # Device-seconds (train + eval time x devices) the whole study may spend; null: no cap
    budget_s: float | None = None
    max_failure_rate: float = 0.5  # FAIL share of this worker's trials that stops it
    min_trials_for_failure_rate: int = 4
    heartbeat_interval: float = 15.0  # seconds between heartbeats of a running trial
    stale_after: float = 120.0  # a RUNNING trial without a heartbeat this long is failed
    retry_stale: int = 0  # re-queue a stale trial this many times (same parameters)
    wait_for_running: bool = True  # at the end, wait for other workers' trials
    poll_interval: float = 2.0
    enqueue: list[Any] = field(default_factory=list)  # parameter sets to try first
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    search_space_fn: str | None = None  # dotted path of fn(cfg, trial) -> {key: value} | None
    # The default search space; a config's own hydra.sweeper.params replaces it whole, and a
    # key set to null here is not searched.
    params: Any = None
    tensorboard: bool = True  # hparams per trial in <hydra.sweep.dir>/tensorboard
    batch_size_study: BatchSizeStudyConfig | None = None  # null: a study of any other kind
    # The fleet (docs/scaling.md, "A node, a cluster"): worker processes sharing the study,
    # each pinned to its own GPUs through CUDA_VISIBLE_DEVICES. workers: a number, or auto (one per
    # gpus_per_trial visible GPUs, 1 without a GPU); devices: null (the visible GPUs) or a list
    # of CUDA_VISIBLE_DEVICES entries; gpus_per_trial: ranks of each trial (torchrun's API);
    # trials_per_gpu: workers that share one GPU (small trials), a number or auto: up to
    # max_trials_per_gpu workers, as many running at once as the study's measured peak memory
    # fits in gpu_memory_gib (null: the card's) less the gpu preset's memory_headroom.
    workers: Any = 1
    devices: Any = None
    gpus_per_trial: int = 1
    trials_per_gpu: Any = 1
    max_trials_per_gpu: int = 4
    gpu_memory_gib: float | None = None
    trial_number: int | None = None  # set by the sweeper for each job
    reporter: str | None = None  # set by the sweeper: dotted path of fn(cfg) -> Reporter
