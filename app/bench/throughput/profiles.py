"""What the benchmark runs: contenders, profiles and the ablation arms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

CONTENDERS = ("trainer", "bare", "hf")


class Profile(TypedDict):
    overrides: list[str]  # for every contender and variant
    warmup: int  # steps left out of the throughput
    steps: int  # measured steps
    variants: dict[str, list[str]]  # name -> its own overrides
    lockstep: NotRequired[bool]  # the default of --lockstep (off)


# Profile: config overrides shared by every contender, warm-up/measured steps and the variants
# (extra overrides per variant, e.g. compile on/off). Batch sizes are fixed, never `auto`, so the
# three contenders do exactly the same work.
PROFILES: dict[str, Profile] = {
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
    # Sequence classification (app/bench/throughput/tasks.py): the tiny DeBERTa on the built-in NLI
    # corpus, length-grouped steps padded per micro-batch; throughput in samples/s. The
    # experiment's 16 samples per step, as 8 x 2 so accumulation is part of it.
    "nli_tiny": {
        "overrides": [
            "experiment=nli_tiny",
            "training.effective_batch_size=16",
            "training.micro_batch_size=8",
        ],
        "warmup": 20,
        "steps": 300,
        "variants": {"eager": []},
        "lockstep": True,
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
    "smoke_nli": {
        "overrides": [
            "experiment=nli_tiny",
            "data.builtin_num_docs=600",
            "data.max_length=64",
            "model.n_layer=1",
            "model.n_embd=32",
            "model.n_head=2",
            "model.intermediate_size=64",
            "training.effective_batch_size=8",
            "training.micro_batch_size=4",
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
    options: dict[str, str] = field(default_factory=dict)  # contender-specific knobs
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
        # Two extra gradient norms per step, kept on the device (the profiles' plans have two
        # micro-batches a step, which the estimate needs).
        "noise scale": [
            Arm("off", "trainer"),
            Arm("on", "trainer", ["training.noise_scale=true"]),
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
