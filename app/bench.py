"""`python -m app.bench`: this trainer vs a bare PyTorch loop vs the transformers Trainer.

The same model, data, batch plan, precision and optimizer recipe are trained by three contenders:

- trainer: `app.runner.run_training` with a composed config (the code path users run);
- bare: the floor, a hand-written loop (plain model, AdamW, autocast, clipping, nothing else)
  with the trainer's process settings (the host malloc policy);
- hf: `transformers.Trainer` + `TrainingArguments` (same batch, accumulation and LR; no eval,
  no logging, no saving), stock: glibc's malloc defaults (`--ablate` times it with ours too).

Each (contender, round) runs in its own subprocess, so imports, allocator state and peak RSS of
one never leak into another, and the contenders alternate round by round so that a slow patch of
a shared machine hits all of them. Throughput is steady state: the wall time from the end of the
warm-up steps to the end of the last step (with a device sync at both ends), median over rounds.

    python -m app.bench                          # CPU: tiny GPT-2, seq 128, batch 32 (minutes)
    python -m app.bench --profile gpt2_small     # GPU: GPT-2 small, seq 1024, bf16, +/- compile
    python -m app.bench --ablate                 # speed-up options, one at a time
    python -m app.bench --startup                # `app.train --help` / `--cfg job` latency
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

CONTENDERS = ("trainer", "bare", "hf")

# Profile: config overrides shared by every contender, warm-up/measured steps and the variants
# (extra overrides per variant, e.g. compile on/off). Batch sizes are fixed, never `auto`, so the
# three contenders do exactly the same work.
PROFILES: dict[str, dict[str, Any]] = {
    "tiny": {
        "overrides": ["training.effective_batch_size=32", "training.micro_batch_size=16"],
        "warmup": 5,
        "steps": 40,  # ~6 s measured per run: shorter windows were dominated by machine noise
        "variants": {"eager": []},
        "lockstep": True,  # a shared CPU drifts by more than the differences measured
    },
    "gpt2_small": {
        "overrides": [
            "model=gpt2_small",
            "data=synthetic",
            "data.seq_len=1024",
            "precision=bf16",
            "training.effective_batch_size=32",
            "training.micro_batch_size=16",
            "training.lr=6e-4",
        ],
        "warmup": 10,
        "steps": 40,
        "variants": {"eager": ["model.compile=false"], "compile": ["model.compile=true"]},
    },
    # For tests: seconds, not minutes.
    "smoke": {
        "overrides": [
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "data.seq_len=32",
            "data.builtin_num_docs=200",
            "training.effective_batch_size=4",
            "training.micro_batch_size=2",
        ],
        "warmup": 1,
        "steps": 3,
        "variants": {"eager": []},
        "lockstep": True,
    },
}


@dataclass
class Arm:
    """One thing to time: a contender with extra overrides, options and environment."""

    label: str
    contender: str
    overrides: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)  # contender-specific knobs
    env: dict[str, str] = field(default_factory=dict)


def ablations(profile: str) -> dict[str, list[Arm]]:
    """Each speed-up on its own: the first arm is the current default, the others the change."""
    common = {
        # torch's own default off CUDA is the per-parameter for-loop: the trainer's today.
        "adamw (bare loop)": [
            Arm("for-loop", "bare", options={"adamw": "forloop"}),
            Arm("foreach", "bare", options={"adamw": "foreach"}),
            Arm("fused", "bare", options={"adamw": "fused"}),
        ],
        "attention": [
            Arm("sdpa", "trainer", ["model.attn_implementation=sdpa"]),
            Arm("eager", "trainer", ["model.attn_implementation=eager"]),
        ],
        "dataloader workers": [
            Arm("auto", "trainer"),
            Arm("0", "trainer", ["data.num_workers=0"]),
            Arm("1", "trainer", ["data.num_workers=1"]),
        ],
        "log cadence": [
            Arm("log_every=1000", "trainer", ["training.log_every=1000"]),
            Arm("log_every=10", "trainer", ["training.log_every=10"]),
            Arm("log_every=1", "trainer", ["training.log_every=1"]),
        ],
        "grad clipping": [
            Arm("max_grad_norm=1", "trainer"),
            Arm("off", "trainer", ["training.max_grad_norm=0"]),
        ],
        "host malloc": [
            Arm("retain", "trainer"),
            Arm("default (glibc)", "trainer", ["training.host_malloc=default"]),
        ],
        "host malloc (transformers Trainer)": [
            Arm("default (glibc, stock)", "hf"),
            Arm("retain", "hf", options={"host_malloc": "retain"}),
        ],
    }
    if profile != "gpt2_small":
        common["micro-batch"] = [
            Arm("16 x 2", "trainer"),
            Arm("32 x 1", "trainer", ["training.micro_batch_size=32"]),
        ]
        return common
    return common | {
        "precision": [
            Arm("bf16", "trainer"),
            Arm("tf32", "trainer", ["precision=tf32"]),
            Arm("fp32", "trainer", ["precision=fp32"]),
        ],
        "pinned memory": [
            Arm("pinned", "trainer", ["data.pin_memory=true"]),
            Arm("pageable", "trainer", ["data.pin_memory=false"]),
        ],
        "allocator": [
            Arm("default", "trainer"),
            Arm(
                "expandable_segments",
                "trainer",
                env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            ),
        ],
        "persistent workers": [
            Arm("persistent", "trainer", ["data.persistent_workers=true"]),
            Arm("not persistent", "trainer", ["data.persistent_workers=false"]),
        ],
    }


# ---------------------------------------------------------------------------------------------
# Parent: schedule the subprocesses, aggregate, print


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(Path(args.worker))
    if args.startup:
        report = {"machine": machine_info(), "startup": measure_startup(args.startup_runs)}
        print(startup_table(report["startup"]))
    elif args.adamw:
        report = {"machine": machine_info(), "adamw": adamw_step_times(args.rounds)}
        print(adamw_table(report["adamw"]))
    elif args.ablate:
        report = run_ablations(args)
        print(ablation_table(report))
    else:
        report = run_benchmark(args)
        print(benchmark_table(report))
    path = Path(args.json or default_json_path(args))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nJSON: {path}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.bench", description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="tiny", choices=sorted(PROFILES))
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    p.add_argument(
        "--lockstep",
        action=argparse.BooleanOptionalAction,
        help="contenders take turns step by step (default: on for the CPU profiles)",
    )
    p.add_argument("--warmup", type=int, help="steps excluded from throughput")
    p.add_argument("--steps", type=int, help="measured steps after the warm-up")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    p.add_argument("--variants", help="comma-separated subset of the profile's variants")
    p.add_argument("--ablate", action="store_true", help="time each speed-up option alone")
    p.add_argument("--only", help="ablate: comma-separated subset of ablation names")
    p.add_argument("--startup", action="store_true", help="time app.train --help / --cfg job")
    p.add_argument("--startup-runs", type=int, default=7)
    p.add_argument("--adamw", action="store_true", help="time one AdamW step per implementation")
    p.add_argument("--json", help="where to write the JSON report")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one spec file
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every contender")
    return p.parse_args(argv)


def default_json_path(args: argparse.Namespace) -> str:
    kinds = {"startup": args.startup, "adamw": args.adamw, "ablate": args.ablate}
    kind = next((k for k, on in kinds.items() if on), "bench")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"outputs/bench/{kind}-{args.profile}-{stamp}.json"


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    prof = PROFILES[args.profile]
    contenders = [c for c in args.contenders.split(",") if c]
    variants = _pick(prof["variants"], args.variants)
    arms = {
        (v, c): Arm(c, c, [*extra, *args.overrides])
        for v, extra in variants.items()
        for c in contenders
    }
    results = run_rounds(args, prof, arms)
    rows = []
    for (variant, contender), runs in results.items():
        rows.append({"variant": variant, "contender": contender, **aggregate(runs)})
    add_ratios(rows, key=lambda r: r["variant"], baseline=lambda r: r["contender"] == "bare")
    return {"kind": "benchmark", **setup_info(args, prof), "rows": rows, "runs": _flat(results)}


def run_ablations(args: argparse.Namespace) -> dict[str, Any]:
    prof = PROFILES[args.profile]
    groups = _pick(ablations(args.profile), args.only)
    arms = {
        (name, arm.label): Arm(
            arm.label, arm.contender, [*arm.overrides, *args.overrides], arm.options, arm.env
        )
        for name, group in groups.items()
        for arm in group
    }
    results = run_rounds(args, prof, arms)
    rows = []
    for (name, label), runs in results.items():
        rows.append(
            {
                "ablation": name,
                "arm": label,
                "contender": arms[name, label].contender,
                **aggregate(runs),
            }
        )
    firsts = {name: group[0].label for name, group in groups.items()}
    add_ratios(
        rows, key=lambda r: r["ablation"], baseline=lambda r: firsts[r["ablation"]] == r["arm"]
    )
    return {"kind": "ablation", **setup_info(args, prof), "rows": rows, "runs": _flat(results)}


def _pick(table: dict[str, Any], names: str | None) -> dict[str, Any]:
    if not names:
        return table
    wanted = [n.strip() for n in names.split(",")]
    unknown = [n for n in wanted if n not in table]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)}; choose from: {', '.join(table)}")
    return {n: table[n] for n in wanted}


def _flat(results: dict[tuple[str, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"group": g, "arm": a, **r} for (g, a), runs in results.items() for r in runs]


def setup_info(args: argparse.Namespace, prof: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": "python -m app.bench " + " ".join(sys.argv[1:]),
        "profile": args.profile,
        "rounds": args.rounds,
        "schedule": "lockstep" if _lockstep(args, prof) else "rounds",
        "warmup_steps": args.warmup or prof["warmup"],
        "measured_steps": args.steps or prof["steps"],
        "overrides": [*prof["overrides"], *args.overrides],
        "machine": machine_info(),
    }


def run_rounds(
    args: argparse.Namespace, prof: dict[str, Any], arms: dict[tuple[str, str], Arm]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every arm once per round; a failed run is recorded.

    The order rotates each round (a, b, c; b, c, a; c, a, b; ...), so over a multiple of the
    number of arms each one runs equally often in every slot: on a shared machine the slot alone
    was measured to move a contender by several percent."""
    results: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in arms}
    keys = list(arms)
    warmup, steps = args.warmup or prof["warmup"], args.steps or prof["steps"]
    for rnd in range(args.rounds):
        if _lockstep(args, prof):
            done = {}
            for group in dict.fromkeys(k[0] for k in keys):  # ratios are within a group
                done |= run_lockstep(
                    {k: arms[k] for k in keys if k[0] == group}, prof, warmup, steps
                )
        else:
            shift = rnd % len(keys)
            done = {
                key: run_worker(arms[key], prof, warmup, steps)
                for key in keys[shift:] + keys[:shift]
            }
        for key, res in done.items():
            res["round"] = rnd
            results[key].append(res)
            _progress_line(key, res)
    return results


def _lockstep(args: argparse.Namespace, prof: dict[str, Any]) -> bool:
    chosen = getattr(args, "lockstep", None)
    return prof.get("lockstep", False) if chosen is None else chosen


def _progress_line(key: tuple[str, str], res: dict[str, Any]) -> None:
    if "error" in res:
        print(f"  {key}: FAILED {res['error']}", file=sys.stderr, flush=True)
        return
    print(
        f"  {key[0]} / {key[1]}: {res['tokens_per_sec']:,.0f} tok/s, "
        f"peak {res['peak_memory_bytes'] / 2**20:,.0f} MiB, first step {res['first_step_s']:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def run_worker(arm: Arm, prof: dict[str, Any], warmup: int, steps: int) -> dict[str, Any]:
    """One run of one arm, alone on the machine."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        spec = _spec(arm, prof, warmup, steps, Path(tmp))
        spec_path = _write_spec(spec)  # last: the clock starts as the process is launched
        proc = subprocess.run(
            _worker_argv(spec_path), env=_env(arm), capture_output=True, text=True
        )
        return _collect(proc.returncode, Path(spec["out"]), (proc.stderr or proc.stdout))


def run_lockstep(
    arms: dict[tuple[str, str], Arm], prof: dict[str, Any], warmup: int, steps: int
) -> dict[tuple[str, str], dict[str, Any]]:
    """One run of each arm, all in lockstep (app/lockstep.py): each sets up alone, then they take
    turns step by step."""
    from app.lockstep import Lane, run_turns

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        lanes: dict[tuple[str, str], Lane] = {}
        outs: dict[tuple[str, str], Path] = {}
        for i, (key, arm) in enumerate(arms.items()):
            sub = Path(tmp) / str(i)
            sub.mkdir()
            lane = Lane(key, sub / "log.txt")
            spec = _spec(arm, prof, warmup, steps, sub, baton=list(lane.child_fds))
            outs[key] = Path(spec["out"])
            lane.start(_worker_argv(_write_spec(spec)), _env(arm))
            lanes[key] = lane
        run_turns(list(lanes.values()), warmup + steps)
        return {
            key: _collect(lane.finish(), outs[key], lane.log_tail()) for key, lane in lanes.items()
        }


def _spec(
    arm: Arm, prof: dict[str, Any], warmup: int, steps: int, tmp: Path, baton=None
) -> dict[str, Any]:
    return {
        "contender": arm.contender,
        "overrides": [*prof["overrides"], *arm.overrides],
        "options": arm.options,
        "warmup": warmup,
        "steps": steps,
        "tmp": str(tmp),
        "out": str(tmp / "result.json"),
        "baton": baton,  # lockstep: the worker's (go, done) pipe ends
    }


def _write_spec(spec: dict[str, Any]) -> Path:
    path = Path(spec["tmp"]) / "spec.json"
    path.write_text(json.dumps({**spec, "start_time": time.time()}))
    return path


def _worker_argv(spec_path: Path) -> list[str]:
    return [sys.executable, "-m", "app.bench", "--worker", str(spec_path)]


def _env(arm: Arm) -> dict[str, str]:
    return {**os.environ, **arm.env}


def _collect(returncode: int, out: Path, output: str) -> dict[str, Any]:
    if returncode != 0 or not out.is_file():
        tail = output.strip().splitlines()[-3:]
        return {"error": f"exit {returncode}: {' | '.join(tail)}"}
    return json.loads(out.read_text())


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"runs_ok": 0, "errors": [r["error"] for r in runs]}
    tps = [r["tokens_per_sec"] for r in ok]
    first = ok[0]
    return {
        "runs_ok": len(ok),
        "by_round": [r.get("tokens_per_sec") for r in runs],  # None: that round failed
        "tokens_per_sec": statistics.median(tps),
        "tokens_per_sec_min": min(tps),
        "tokens_per_sec_max": max(tps),
        "samples_per_sec": statistics.median(r["samples_per_sec"] for r in ok),
        "peak_memory_bytes": statistics.median(r["peak_memory_bytes"] for r in ok),
        "peak_memory_kind": first["peak_memory_kind"],
        "first_step_s": statistics.median(r["first_step_s"] for r in ok),
        "final_loss": statistics.median(r["final_loss"] for r in ok),
        "mfu": _median_or_none([r.get("mfu") for r in ok]),
        "device_name": first["device_name"],
        "dtype": first["dtype"],
        "tokens_per_step": first["tokens_per_step"],
    }


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def add_ratios(rows: list[dict[str, Any]], key, baseline) -> None:
    """tokens/s and peak memory of each row relative to its group's baseline row."""
    bases = {key(r): r for r in rows if baseline(r) and r.get("runs_ok")}
    for row in rows:
        base = bases.get(key(row))
        if base is None or not row.get("runs_ok"):
            continue
        row["speed_ratio"] = row["tokens_per_sec"] / base["tokens_per_sec"]
        row["memory_ratio"] = row["peak_memory_bytes"] / base["peak_memory_bytes"]
        # Ratio within each round, then the median: runs next to each other in time share the
        # machine's load, so this is steadier than the ratio of medians on a shared machine.
        pairs = zip(row["by_round"], base["by_round"], strict=True)
        paired = [a / b for a, b in pairs if a is not None and b is not None]
        row["paired_speed_ratio"] = statistics.median(paired) if paired else None


# ---------------------------------------------------------------------------------------------
# Tables


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def benchmark_table(report: dict[str, Any]) -> str:
    head = (
        "| variant | contender | tokens/s (median) | min-max | vs bare | vs bare, paired "
        "| peak memory MiB | vs bare | first step s | MFU | final loss |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in report["rows"]:
        if not r.get("runs_ok"):
            lines.append(f"| {r['variant']} | {r['contender']} | failed: {r['errors'][0]} |")
            continue
        lines.append(
            f"| {r['variant']} | {r['contender']} | {r['tokens_per_sec']:,.0f} "
            f"| {r['tokens_per_sec_min']:,.0f}-{r['tokens_per_sec_max']:,.0f} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} "
            f"| {_fmt(r.get('memory_ratio'), '.3f')} | {r['first_step_s']:.1f} "
            f"| {_fmt(r['mfu'], '.1%')} | {r['final_loss']:.3f} |"
        )
    return _preamble(report) + "\n".join(lines)


def ablation_table(report: dict[str, Any]) -> str:
    head = (
        "| option | setting | contender | tokens/s (median) | min-max | vs first "
        "| vs first, paired | peak memory MiB |\n|---|---|---|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in report["rows"]:
        if not r.get("runs_ok"):
            lines.append(f"| {r['ablation']} | {r['arm']} | failed: {r['errors'][0]} |")
            continue
        lines.append(
            f"| {r['ablation']} | {r['arm']} | {r['contender']} | {r['tokens_per_sec']:,.0f} "
            f"| {r['tokens_per_sec_min']:,.0f}-{r['tokens_per_sec_max']:,.0f} "
            f"| {_fmt(r.get('speed_ratio'), '.3f')} | {_fmt(r.get('paired_speed_ratio'), '.3f')} "
            f"| {r['peak_memory_bytes'] / 2**20:,.0f} |"
        )
    return _preamble(report) + "\n".join(lines)


def _preamble(report: dict[str, Any]) -> str:
    m = report["machine"]
    first = next((r for r in report["rows"] if r.get("runs_ok")), {})
    return (
        f"profile {report['profile']}: {report['rounds']} rounds "
        f"({report.get('schedule', 'rounds')}), {report['warmup_steps']} warm-up "
        f"+ {report['measured_steps']} measured steps, {first.get('tokens_per_step', '?')} tokens "
        f"per step, {first.get('dtype', '?')} on {first.get('device_name', '?')}\n"
        f"machine: {m['cpu']} ({m['cpus']} cores), torch {m['torch']}, "
        f"transformers {m['transformers']}, Python {m['python']}\n\n"
    )


def machine_info() -> dict[str, Any]:
    from app.hardware import _cpu_name

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    return {
        "cpu": _cpu_name(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "accelerate": version("accelerate"),
        "platform": platform.platform(),
    }


# ---------------------------------------------------------------------------------------------
# AdamW step alone: end-to-end runs of a tiny model are too noisy on a shared CPU to see it

ADAMW_SHAPES = {  # GPT-2 configs: (vocab, positions, width, layers, heads), timed steps
    "tiny_gpt2": ((256, 256, 128, 2, 4), 50),
    "gpt2_small": ((50304, 1024, 768, 12, 12), 3),
}


def adamw_step_times(rounds: int) -> list[dict[str, Any]]:
    """Milliseconds per optimizer step of each AdamW implementation, median over rounds."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    rows = []
    for name, ((vocab, pos, width, layers, heads), reps) in ADAMW_SHAPES.items():
        config = GPT2Config(
            vocab_size=vocab,
            n_positions=pos,
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            bos_token_id=0,
            eos_token_id=0,
        )
        params = list(GPT2LMHeadModel(config).parameters())
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        times: dict[str, list[float]] = {"forloop": [], "foreach": [], "fused": []}
        for _ in range(rounds):
            for impl, samples in times.items():
                kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
                opt = torch.optim.AdamW(params, lr=1e-4, **kwargs)
                opt.step()  # allocates the state outside the timing
                t0 = time.perf_counter()
                for _ in range(reps):
                    opt.step()
                samples.append((time.perf_counter() - t0) / reps * 1000)
        rows += [
            {"model": name, "adamw": k, "ms_per_step": statistics.median(v)}
            for k, v in times.items()
        ]
    return rows


def adamw_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| parameters of | AdamW | ms per step (median) |", "|---|---|---:|"]
    lines += [f"| {r['model']} | {r['adamw']} | {r['ms_per_step']:.1f} |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Start-up latency of the CLI


def measure_startup(runs: int) -> list[dict[str, Any]]:
    out = []
    for label, extra in (("--help", ["--help"]), ("--cfg job", ["--cfg", "job"])):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "app.train", *extra]
            subprocess.run(cmd, capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        out.append(
            {
                "command": f"python -m app.train {label}",
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "runs": runs,
            }
        )
    return out


def startup_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| command | median s | min s | max s | runs |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| `{r['command']}` | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['max_s']:.2f} "
        f"| {r['runs']} |"
        for r in rows
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Worker: one contender in this process


class StepClock:
    """When the steps end, measured with as little disturbance as possible.

    Alone (rounds): timestamps with a device sync only at the first step, the end of the warm-up
    and the last step, so measuring adds nothing to the steps in between; the measured time is
    warm-up end to last step end.

    In lockstep (app/lockstep.py): the worker passes the baton before its first step and after
    each one, and a step is timed from the parent's go to its end (a device sync there, so a GPU
    does not run on into the next contender's turn). The measured time is the sum over the steps
    after the warm-up, and holds everything the loop does between two steps.
    """

    def __init__(self, start_time: float, warmup: int, total: int, device, baton=None) -> None:
        self.start_time, self.warmup, self.total, self.device = start_time, warmup, total, device
        self.baton = baton
        self.done = 0
        self.first_step_s = self.t_warm = self.t_end = None
        self.peak: tuple[int, str] | None = None
        self.ready_s: float | None = None  # lockstep: launch to ready for the first step
        self.t_go = 0.0
        self.turn_seconds = 0.0  # lockstep: the measured steps' turns

    def before_step(self) -> None:
        """Call before every step; in lockstep, the first call waits for the first turn."""
        if self.baton is not None and self.ready_s is None:
            self.ready_s = time.time() - self.start_time
            self._pass_baton()

    def step_done(self) -> None:
        self.done += 1
        if self.baton is not None:
            self._turn_done()
            return
        if self.done not in (1, self.warmup, self.total):
            return
        _sync(self.device)
        now = time.perf_counter()
        if self.done == 1:
            self.first_step_s = time.time() - self.start_time
        if self.done == self.warmup:
            self.t_warm = now
        if self.done == self.total:
            self.t_end = now
            self.peak = peak_memory(self.device)

    def _turn_done(self) -> None:
        _sync(self.device)
        seconds = time.perf_counter() - self.t_go
        if self.done == 1:
            self.first_step_s = self.ready_s + seconds
        if self.done > self.warmup:
            self.turn_seconds += seconds
        if self.done == self.total:
            self.peak = peak_memory(self.device)
        self._pass_baton()  # after the last step: wait to be released, so finishing disturbs none

    def _pass_baton(self) -> None:
        self.baton.pass_()
        self.t_go = time.perf_counter()

    def measured_seconds(self) -> float:
        return self.turn_seconds if self.baton is not None else self.t_end - self.t_warm


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def peak_memory(device) -> tuple[int, str]:
    """CUDA max allocated on GPU; on CPU this process's peak RSS (one contender per process)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "peak_rss"


def worker_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    runner = {"trainer": work_trainer, "bare": work_bare, "hf": work_hf}[spec["contender"]]
    result = runner(spec)
    Path(spec["out"]).write_text(json.dumps(result))
    return 0


def _clock(spec: dict[str, Any], cfg, device) -> StepClock:
    from app.lockstep import Baton

    baton = Baton(*spec["baton"]) if spec.get("baton") else None
    return StepClock(spec["start_time"], spec["warmup"], cfg.training.max_steps, device, baton)


def _compose(spec: dict[str, Any]):
    from app.preflight import compose

    total = spec["warmup"] + spec["steps"]
    return compose("train", [*spec["overrides"], f"training.max_steps={total}"])


def _result(
    clock: StepClock,
    cfg,
    final_loss: float,
    device_name: str,
    dtype: str,
    flops_tok: int | None,
    peak_tflops: float | None,
) -> dict[str, Any]:
    from app.telemetry import mfu

    seconds = clock.measured_seconds()
    tokens_per_step = cfg.training.effective_batch_size * cfg.data.seq_len
    tps = (clock.total - clock.warmup) * tokens_per_step / seconds
    peak, kind = clock.peak
    return {
        "tokens_per_sec": tps,
        "samples_per_sec": tps / cfg.data.seq_len,
        "tokens_per_step": tokens_per_step,
        "measured_seconds": seconds,
        "first_step_s": clock.first_step_s,
        "peak_memory_bytes": peak,
        "peak_memory_kind": kind,
        "final_loss": final_loss,
        "device_name": device_name,
        "dtype": dtype,
        "mfu": mfu(tps, flops_tok, peak_tflops) if flops_tok else None,
    }


def _device_setup(cfg, host_malloc: str):
    """Device, precision and the FLOPs/peak figures, resolved exactly as the trainer does, and a
    host malloc policy (app/host_malloc.py) for this process."""
    import torch

    from app.hardware import detect_device, effective_preset
    from app.host_malloc import apply_host_malloc
    from app.precision import apply_precision_flags, resolve_precision

    apply_host_malloc(host_malloc)
    device = detect_device(cfg.gpu)
    preset = effective_preset(cfg.gpu, device)
    precision = resolve_precision(cfg.precision.name, device, preset)
    apply_precision_flags(precision)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(cfg.training.seed)
    return device, preset, precision


def _flops(model, cfg, device, precision) -> tuple[int, float | None]:
    from app.model import model_shape
    from app.telemetry import flops_per_token

    s = model_shape(model)
    flops = flops_per_token(s.num_params, s.n_layer, s.n_head, s.head_dim, cfg.data.seq_len)
    return flops, device.peak_tflops.get(precision.name)


def work_trainer(spec: dict[str, Any]) -> dict[str, Any]:
    """The real `run_training`; the only addition is a timestamp after each optimizer step."""
    import torch

    import app.loop as loop
    from app.runner import run_training

    # Evaluation and checkpoints run after the last timed step; nothing else is changed.
    total = spec["warmup"] + spec["steps"]
    extra = [
        "training.eval_at_start=false",
        f"training.eval_every={total}",
        "training.checkpoint_every=0",
    ]
    cfg = _compose({**spec, "overrides": [*spec["overrides"], *extra]})
    device = torch.device("cuda" if _wants_cuda(cfg) else "cpu")
    clock = _clock(spec, cfg, device)
    inner = loop.step_with_recovery

    def timed(run, blocks, step):
        clock.before_step()
        out = inner(run, blocks, step)
        clock.step_done()
        return out

    loop.step_with_recovery = timed  # train() looks it up at call time
    try:
        summary = run_training(cfg, Path(spec["tmp"]) / "run")
    finally:
        loop.step_with_recovery = inner
    return _result(
        clock,
        cfg,
        summary["final_train_loss"],
        summary["device_name"],
        summary["dtype"],
        summary["flops_per_token"],
        summary["peak_tflops"],
    )


def _wants_cuda(cfg) -> bool:
    import torch

    return cfg.gpu.device_type != "cpu" and torch.cuda.is_available()


def _batch_plan(cfg) -> tuple[int, int]:
    eff, micro = cfg.training.effective_batch_size, cfg.training.micro_batch_size
    if eff % micro:
        raise SystemExit("bench needs training.effective_batch_size divisible by micro_batch_size")
    return micro, eff // micro


def _adamw(model, cfg, impl: str):
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.training.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    t = cfg.training
    return torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), eps=t.eps, **kwargs)


def work_bare(spec: dict[str, Any]) -> dict[str, Any]:
    """The floor: model, AdamW, autocast, clip, step. No loader, no logging, no framework."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from app.data import load_token_data
    from app.model import build_model
    from app.optim import build_scheduler

    cfg = _compose(spec)
    # The floor gets every process setting the trainer has, the host malloc policy included.
    device, _, precision = _device_setup(cfg, cfg.training.host_malloc)
    dev = device.torch_device
    data = load_token_data(cfg.data)
    model = build_model(cfg.model, data.vocab_size).to(dev)
    flops, peak_tflops = _flops(model, cfg, device, precision)
    # Fused is the fastest AdamW on CUDA and, since torch 2.4, on CPU too (see --ablate).
    impl = spec["options"].get("adamw", "fused")
    opt = _adamw(model, cfg, impl)
    sched = build_scheduler(opt, cfg.training)  # the same warmup + cosine LambdaLR
    fwd = torch.compile(model) if cfg.model.compile else model
    micro, accum = _batch_plan(cfg)
    amp = (
        torch.autocast(dev.type, dtype=precision.autocast_dtype)
        if precision.autocast_dtype is not None
        else contextlib.nullcontext()
    )
    blocks = data.train.pin_memory() if dev.type == "cuda" else data.train
    gen = torch.Generator().manual_seed(cfg.data.seed)
    clock = _clock(spec, cfg, dev)
    model.train()
    for _ in range(cfg.training.max_steps):
        clock.before_step()
        idx = torch.randint(len(blocks), (micro * accum,), generator=gen)
        batch = blocks[idx].to(dev, non_blocking=True)
        for i in range(accum):
            part = batch[i * micro : (i + 1) * micro]
            with amp:
                logits = fwd(input_ids=part[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), part[:, 1:].flatten()) / accum
            del logits  # else the next forward cannot reuse its memory: 1-3 % on CPU
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        clock.step_done()
    return _result(clock, cfg, loss.item() * accum, device.name, precision.name, flops, peak_tflops)


def work_hf(spec: dict[str, Any]) -> dict[str, Any]:
    """transformers.Trainer with the same model, batch plan, optimizer recipe and precision."""
    from transformers import TrainerCallback, TrainingArguments

    from app.data import load_token_data, resolve_num_workers
    from app.model import build_model

    cfg = _compose(spec)
    # Stock, as users run it: glibc's malloc defaults unless an ablation arm asks otherwise.
    device, preset, precision = _device_setup(cfg, spec["options"].get("host_malloc", "default"))
    dev = device.torch_device
    data = load_token_data(cfg.data)
    model = build_model(cfg.model, data.vocab_size)
    flops, peak_tflops = _flops(model, cfg, device, precision)
    micro, accum = _batch_plan(cfg)
    clock = _clock(spec, cfg, dev)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.before_step()

        def on_step_end(self, args, state, control, **kwargs):
            clock.step_done()

    t = cfg.training
    args = TrainingArguments(
        output_dir=str(Path(spec["tmp"]) / "hf"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        max_steps=t.max_steps,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        adam_beta1=t.betas[0],
        adam_beta2=t.betas[1],
        adam_epsilon=t.eps,
        max_grad_norm=t.max_grad_norm,
        lr_scheduler_type="cosine",
        warmup_steps=t.warmup_steps,
        # optim stays at its default, as users run it: adamw_torch_fused (torch >= 2.8).
        bf16=precision.name == "bf16",
        fp16=precision.name == "fp16",
        torch_compile=bool(cfg.model.compile),
        use_cpu=dev.type == "cpu",
        dataloader_num_workers=resolve_num_workers(cfg.data.num_workers, preset.dataloader_workers),
        dataloader_drop_last=True,
        remove_unused_columns=False,
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        seed=t.seed,
    )
    trainer = _hf_trainer(
        model=model, args=args, train_dataset=_HfBlocks(data.train), callbacks=[Clock()]
    )
    trainer.train()
    # With accumulation the Trainer divides each micro-batch's loss by the whole step's tokens.
    loss = float(trainer.last_loss) * accum
    return _result(clock, cfg, loss, device.name, precision.name, flops, peak_tflops)


def _hf_trainer(**kwargs):
    # Subclassed inside a function: transformers is imported only in the hf worker.
    from transformers import Trainer

    class LastLossTrainer(Trainer):
        """Keeps the last micro-batch loss (a device tensor: no sync) for the sanity column."""

        def compute_loss(self, model, inputs, *args, **kw):
            loss = super().compute_loss(model, inputs, *args, **kw)
            self.last_loss = (loss[0] if isinstance(loss, tuple) else loss).detach()
            return loss

    return LastLossTrainer(**kwargs)


class _HfBlocks:
    """Packed blocks as the Trainer wants them; the model shifts the labels itself."""

    def __init__(self, blocks) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = self.blocks[i, :-1]
        return {"input_ids": x, "labels": x}


if __name__ == "__main__":
    sys.exit(main())
