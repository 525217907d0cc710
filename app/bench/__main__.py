"""Command line of `python -m app.bench` (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from app.bench import __doc__ as package_doc
from app.bench.mup.coord_check import CoordSetup, coord_check, coord_table
from app.bench.mup.figures import plot_coord_check, plot_lr_transfer
from app.bench.mup.transfer import LRS as MUP_LRS
from app.bench.mup.transfer import (
    earlier_transfer_studies,
    mean_curves,
    run_transfer_bench,
    transfer_table,
)
from app.bench.studies.batch_budget import batch_budget_table, run_batch_budget_bench
from app.bench.studies.batch_schedule import (
    FRACTIONS,
    LRS,
    Grid,
    batch_schedule_table,
    plot_batch_schedule,
    run_batch_schedule_bench,
)
from app.bench.studies.default_study import (
    check_pruner_only,
    default_study_table,
    earlier_studies,
    run_default_study_bench,
)
from app.bench.studies.fleet import fleet_table, run_fleet_bench
from app.bench.studies.hpo import hpo_table, run_hpo_bench
from app.bench.studies.hpo_peers import CONTENDERS as HPO_PEERS
from app.bench.studies.hpo_peers import SAMPLERS as PEER_SAMPLERS
from app.bench.studies.hpo_peers import peers_tables, run_peers_bench
from app.bench.studies.mf.run import CONTENDERS as MF_CONTENDERS
from app.bench.studies.mf.run import DEFAULT_BENCHMARKS as MF_BENCHMARKS
from app.bench.studies.mf.run import EVERY_CONTENDER as MF_EVERY
from app.bench.studies.mf.run import SEEDS as MF_SEEDS
from app.bench.studies.mf.run import mf_table, plot_mf, run_mf_bench
from app.bench.studies.sampler_choice import ARMS as SAMPLER_ARMS
from app.bench.studies.sampler_choice import STUDIES as SAMPLER_STUDIES
from app.bench.studies.sampler_choice import run_sampler_choice, sampler_choice_table
from app.bench.studies.study_report import report_bench_table, run_report_bench
from app.bench.studies.warm_start import PAIRS as WARM_PAIRS
from app.bench.studies.warm_start import run_warm_start_bench, warm_start_table
from app.bench.throughput.micro import adamw_step_times, adamw_table, measure_startup, startup_table
from app.bench.throughput.parallel import parallel_table, run_parallel_bench
from app.bench.throughput.probe_share import probe_share_table, run_probe_share_bench
from app.bench.throughput.profiles import CONTENDERS, PROFILES
from app.bench.throughput.report import ablation_table, benchmark_table, machine_info
from app.bench.throughput.schedule import run_ablations, run_benchmark
from app.bench.throughput.workers import worker_main
from app.config.training import LR_SCALINGS


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(Path(args.worker))
    report, table = run(args)
    print(table)
    path = Path(args.json or default_json_path(args))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nJSON: {path}")
    return 0


def run(args: argparse.Namespace) -> tuple[Mapping[str, object], str]:
    """The chosen bench's JSON report and its markdown table."""
    if args.startup:
        startup = measure_startup(args.startup_runs)
        return {"machine": machine_info(), "startup": startup}, startup_table(startup)
    if args.adamw:
        adamw = adamw_step_times(args.rounds)
        return {"machine": machine_info(), "adamw": adamw}, adamw_table(adamw)
    if args.parallel:
        parallel = run_parallel_bench(args.overrides, args.rounds)
        return {"machine": machine_info(), **parallel}, parallel_table(parallel)
    if args.fleet:
        fleet = run_fleet_bench(args.overrides, args.rounds)
        return {"machine": machine_info(), **fleet}, fleet_table(fleet)
    if args.hpo:
        hpo = run_hpo_bench(args.overrides)
        return {"machine": machine_info(), **hpo}, hpo_table(hpo)
    if args.batch_budget:
        budget = run_batch_budget_bench(args.overrides, _seeds(args))
        return {"machine": machine_info(), **budget}, batch_budget_table(budget)
    if args.hpo_peers:
        peers = args.peers.split(",") if args.peers else list(HPO_PEERS)
        samplers = args.samplers.split(",")
        studies = run_peers_bench(args.overrides, peers, samplers)
        return {"machine": machine_info(), **studies}, peers_tables(studies)
    if args.mf_peers:
        return run_mf(args)
    if args.batch_schedule:
        grid = Grid(args.lrs or LRS, args.fractions or FRACTIONS, args.lr_scalings)
        schedule = run_batch_schedule_bench(args.overrides, _seeds(args), _cores(args), grid)
        png = Path(args.json or default_json_path(args)).with_suffix(".png")
        plot_batch_schedule(schedule, png)
        return {
            "machine": machine_info(),
            **schedule,
        }, f"{batch_schedule_table(schedule)}\n\nplot: {png}"
    if args.coord_check:
        setup = CoordSetup(
            seeds=tuple(_seeds(args)),
            optimizer=args.optimizer,
            lr=args.lr or CoordSetup.lr,
            steps=args.steps or CoordSetup.steps,
        )
        coords = coord_check(setup, args.overrides)
        png = Path(args.json or default_json_path(args)).with_suffix(".png")
        plot_coord_check(coords, png)
        return {"machine": machine_info(), **coords}, f"{coord_table(coords)}\n\nplot: {png}"
    if args.mup_transfer:
        earlier = earlier_transfer_studies(args.reuse or "")
        transfer = run_transfer_bench(
            args.overrides, _seeds(args), _cores(args), args.lrs or MUP_LRS, earlier
        )
        png = Path(args.json or default_json_path(args)).with_suffix(".png")
        plot_lr_transfer(mean_curves(transfer), png, "validation loss against the rate")
        table = f"{transfer_table(transfer)}\n\nplot: {png}"
        return {"machine": machine_info(), **transfer}, table
    if args.warm_start:
        pairs = args.pairs.split(",") if args.pairs else list(WARM_PAIRS)
        warm = run_warm_start_bench(args.overrides, _seeds(args), pairs, args.take, _cores(args))
        return {"machine": machine_info(), **warm}, warm_start_table(warm)
    if args.default_study:
        if args.reuse_unpruned:
            check_pruner_only(args.overrides)
        reuse = earlier_studies(args.reuse or "", unpruned=args.reuse_unpruned)
        study = run_default_study_bench(args.overrides, _seeds(args), reuse, args.budget_only)
        return {"machine": machine_info(), **study}, default_study_table(study)
    if args.sampler_choice:
        arms = args.arms.split(",") if args.arms else list(SAMPLER_ARMS)
        kinds = args.studies.split(",") if args.studies else list(SAMPLER_STUDIES)
        partial = Path(f"{args.json or default_json_path(args)}.partial.jsonl")
        partial.parent.mkdir(parents=True, exist_ok=True)
        choice = run_sampler_choice(args.overrides, _seeds(args), arms, kinds, partial)
        return {"machine": machine_info(), **choice}, sampler_choice_table(choice)
    if args.probe_share:
        checkout = Path(args.checkout).resolve() if args.checkout else None
        share = run_probe_share_bench(args.overrides, args.rounds, checkout)
        return {"machine": machine_info(), **share}, probe_share_table(share)
    if args.report:
        timed = run_report_bench(args.rounds)
        return {"machine": machine_info(), **timed}, report_bench_table(timed)
    if args.ablate:
        ablation = run_ablations(args)
        return ablation, ablation_table(ablation)
    bench = run_benchmark(args)
    return bench, benchmark_table(bench)


def run_mf(args: argparse.Namespace) -> tuple[Mapping[str, object], str]:
    """The multi-fidelity bench: its report, table and plot (beside the JSON)."""
    optimizers = args.optimizers.split(",") if args.optimizers else list(MF_CONTENDERS)
    benchmarks = args.benchmarks.split(",") if args.benchmarks else MF_BENCHMARKS
    unknown = sorted(set(optimizers) - set(MF_EVERY))
    if unknown:
        raise SystemExit(f"--optimizers: {unknown} not among {', '.join(MF_EVERY)}")
    seeds = _seeds(args, default=",".join(map(str, MF_SEEDS)))
    json_path = Path(args.json or default_json_path(args))
    partial = json_path.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    report = run_mf_bench(benchmarks, optimizers, seeds, partial)
    png = json_path.with_suffix(".png")
    plot_mf(report, png)
    return {"machine": machine_info(), **report}, f"{mf_table(report)}\n\nplot: {png}"


def _seeds(args: argparse.Namespace, default: str = "0,1") -> list[int]:
    return [int(s) for s in (args.seeds or default).split(",")]


def _floats(text: str) -> tuple[float, ...]:
    """A comma-separated list of positive numbers (argparse says which option on an error)."""
    values = tuple(float(x) for x in text.split(","))
    if any(v <= 0 for v in values):
        raise ValueError(text)
    return values


def _lr_scalings(text: str) -> tuple[str, ...]:
    values = tuple(text.split(","))
    if any(v not in LR_SCALINGS for v in values):
        raise ValueError(text)
    return values


def _log_text(path: str) -> str:
    """An earlier run's stderr, read once (argparse names the option on an error)."""
    try:
        return Path(path).read_text()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror}") from None


def _cores(args: argparse.Namespace) -> list[int] | None:
    return [int(c) for c in args.cores.split(",")] if args.cores else None


# The benches a flag picks (none: the throughput bench), each with what it measures; the JSON
# report is named after the first one set.
KINDS = {
    "startup": "time app.train --help / --cfg job",
    "adamw": "time one AdamW step per implementation",
    "hpo": "a seeded study with and without pruning",
    "fleet": "a seeded study with 1 and 2 workers",
    "parallel": "DDP and FSDP on 2 ranks, OOM agreement on/off",
    "hpo-peers": "the seeded study by this sweeper (pruners) and by the transformers Trainer",
    "mf-peers": "the default study vs Optuna+Hyperband, SMAC3, DEHB, Syne Tune, Ray Tune on "
    "multi-fidelity Hartmann functions",
    "batch-budget": "studies at a data budget vs fixed steps, against a grid's true best",
    "report": "time a study report of 200 trials (app.report)",
    "sampler-choice": "the default study and the bench's under each candidate sampler",
    "default-study": "the default study against a grid, its unpruned self and the Trainer's study",
    "warm-start": "the default study warm-started from a related one, against the same cold",
    "batch-schedule": "the adaptive batch (training.batch_schedule=adaptive) vs fixed batches",
    "probe-share": "the micro-batch probe's cost to a 100-step run, compiled and eager",
    "coord-check": "μP's coordinate check: activations against the width, per parametrization",
    "mup-transfer": "the best LR across widths under each parametrization; a μP proxy study",
    "ablate": "time each speed-up option alone",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.bench", description=package_doc.splitlines()[0])
    for kind, what in KINDS.items():
        p.add_argument(f"--{kind}", action="store_true", help=what)
    p.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    p.add_argument(
        "--lockstep",
        action=argparse.BooleanOptionalAction,
        help="contenders take turns step by step (default: on for the CPU profiles)",
    )
    p.add_argument("--warmup", type=int, help="steps excluded from throughput")
    p.add_argument(
        "--steps", type=int, help="measured steps after the warm-up (coord-check: steps trained)"
    )
    p.add_argument("--optimizer", default="adamw", help="coord-check: training.optimizer")
    p.add_argument("--lr", type=float, help=f"coord-check: training.lr (default {CoordSetup.lr})")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    p.add_argument("--variants", help="comma-separated subset of the profile's variants")
    p.add_argument("--only", help="ablate: comma-separated subset of ablation names")
    p.add_argument("--startup-runs", type=int, default=7)
    p.add_argument(
        "--lrs",
        type=_floats,
        help=f"batch-schedule, mup-transfer: comma-separated LRs (default {LRS}; {MUP_LRS})",
    )
    p.add_argument(
        "--fractions",
        type=_floats,
        help=f"batch-schedule: comma-separated noise fractions (default {FRACTIONS})",
    )
    p.add_argument(
        "--lr-scalings",
        type=_lr_scalings,
        default=("none",),
        help="batch-schedule: comma-separated training.lr_scaling of the adaptive runs "
        f"(default none; of {', '.join(LR_SCALINGS)})",
    )
    p.add_argument(
        "--reuse",
        type=_log_text,  # the log's text (argparse passes a string default through it too)
        help="default-study: take the grid and Trainer studies from this earlier stderr; "
        "mup-transfer: the grids and the standard proxy study that log holds",
    )
    p.add_argument(
        "--reuse-unpruned",
        action="store_true",
        help="default-study: its unpruned studies too (overrides of hpo.pruner* only)",
    )
    p.add_argument(
        "--budget-only",
        action="store_true",
        help="default-study: only the unpruned and the default studies (goals b and c), in "
        "about half the time: no grid, Trainer or retraining",
    )
    p.add_argument("--pairs", help=f"warm-start: comma-separated subset of {','.join(WARM_PAIRS)}")
    p.add_argument(
        "--cores",
        help="warm-start, batch-schedule, mup-transfer: CPUs to run studies or runs on side by "
        "side, one each (e.g. 0,1)",
    )
    p.add_argument("--take", default="enqueue", help="warm-start: enqueue | observe")
    p.add_argument(
        "--arms", help=f"sampler-choice: comma-separated subset of {','.join(SAMPLER_ARMS)}"
    )
    p.add_argument(
        "--studies", help=f"sampler-choice: comma-separated subset of {','.join(SAMPLER_STUDIES)}"
    )
    p.add_argument(
        "--seeds",
        help="batch-budget, batch-schedule, sampler-choice, default-study, warm-start, "
        "coord-check, mup-transfer (default 0,1), mf-peers (default 0..7): comma-separated seeds",
    )
    p.add_argument(
        "--optimizers",
        help=f"mf-peers: comma-separated, of {','.join(MF_EVERY)} (default: "
        f"{','.join(MF_CONTENDERS)})",
    )
    p.add_argument(
        "--benchmarks", help=f"mf-peers: comma-separated subset of {','.join(MF_BENCHMARKS)}"
    )
    p.add_argument("--peers", help=f"hpo-peers: comma-separated subset of {','.join(HPO_PEERS)}")
    p.add_argument(
        "--samplers",
        default=",".join(PEER_SAMPLERS),
        help="hpo-peers: comma-separated subset of " + ",".join(PEER_SAMPLERS),
    )
    p.add_argument("--checkout", help="probe-share: run this checkout's trainer (before/after)")
    p.add_argument("--json", help="where to write the JSON report")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one spec file
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every contender")
    args = p.parse_args(argv)
    unread = unread_option(args)
    if unread:
        p.exit(2, f"{p.prog}: error: {unread}\n")  # one line, not the long usage
    return args


# The options only some benches read, and those benches: one given to none of them would be
# ignored without a word (an hour's bench run without the setting that was asked for).
READERS: dict[str, tuple[str, ...]] = {
    "reuse": ("default-study", "mup-transfer"),
    "reuse_unpruned": ("default-study",),
    "budget_only": ("default-study",),
    "pairs": ("warm-start",),
    "cores": ("warm-start", "batch-schedule", "mup-transfer"),
    "arms": ("sampler-choice",),
    "studies": ("sampler-choice",),
    "optimizers": ("mf-peers",),
    "benchmarks": ("mf-peers",),
    "peers": ("hpo-peers",),
    "checkout": ("probe-share",),
    "lrs": ("batch-schedule", "mup-transfer"),
    "fractions": ("batch-schedule",),
    "lr": ("coord-check",),
    "only": ("ablate",),
    "seeds": (
        "batch-budget",
        "batch-schedule",
        "sampler-choice",
        "default-study",
        "warm-start",
        "coord-check",
        "mup-transfer",
        "mf-peers",
    ),
}


def unread_option(args: argparse.Namespace) -> str | None:
    """What to say about the first option given where no chosen bench reads it."""
    for dest, kinds in READERS.items():
        given = getattr(args, dest) not in (None, False)
        if given and not any(getattr(args, kind.replace("-", "_")) for kind in kinds):
            allowed = " or ".join(f"--{kind}" for kind in kinds)
            return (
                f"--{dest.replace('_', '-')} is read only by {allowed}; add one or drop the option"
            )
    return None


def default_json_path(args: argparse.Namespace) -> str:
    kind = next((k for k in KINDS if getattr(args, k.replace("-", "_"))), "bench")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"outputs/bench/{kind}-{args.profile}-{stamp}.json"


if __name__ == "__main__":
    sys.exit(main())
