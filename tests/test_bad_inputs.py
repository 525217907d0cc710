"""Bad input, as a hostile user would try it: one `error:` line, status 2, nothing touched.

Every case runs the real entrypoint (`python -m app.train`: preflight, then Hydra) in this process,
pointed at a copy of a finished run directory (and, for sweeps, at an existing study). The
directory and the study must be byte for byte as they were: a refused run writes nothing, not
even Hydra's own `.hydra/` files. The table in docs/bad_inputs.md lists the same cases.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import subprocess
from pathlib import Path

import optuna
import pytest
import torch

from tests.conftest import TINY, invoke_here, save_tiny_gpt2, train_here
from tests.kinds import fill

pytestmark = pytest.mark.integration

RESUME = "training.resume=auto"
# (id, overrides, text the error line must hold). {tmp} is the test's scratch directory.
CASES = [
    # training: numbers that are not numbers, or absurd
    ("lr-inf", ["training.lr=inf"], "training.lr=inf must be a finite number in (0, 1]"),
    ("lr-huge", ["training.lr=1e9"], "training.lr=1000000000.0 must be"),
    ("lr-zero", ["training.lr=0"], "training.lr=0"),
    ("lr-negative", ["training.lr=-0.001"], "training.lr=-0.001"),
    ("wd-nan", ["training.weight_decay=nan"], "training.weight_decay=nan must be"),
    ("wd-negative", ["training.weight_decay=-0.1"], "training.weight_decay=-0.1"),
    ("wd-times-lr", ["training.lr=0.5", "training.weight_decay=10"], "lr*weight_decay=5"),
    ("eps-nan", ["training.eps=nan"], "training.eps=nan must be"),
    ("eps-negative", ["training.eps=-1"], "training.eps=-1"),
    ("clip-nan", ["training.max_grad_norm=nan"], "training.max_grad_norm=nan must be"),
    ("clip-negative", ["training.max_grad_norm=-1"], "training.max_grad_norm=-1"),
    ("betas-above-1", ["training.betas=[0.9,1.5]"], "training.betas=[0.9, 1.5]"),
    ("betas-one", ["training.betas=[0.9]"], "training.betas=[0.9] must be two numbers"),
    ("min-lr-ratio", ["training.min_lr_ratio=2"], "training.min_lr_ratio=2"),
    ("warmup-negative", ["training.warmup_steps=-5"], "training.warmup_steps=-5"),
    ("max-steps-zero", ["training.max_steps=0"], "training.max_steps=0"),
    ("two-budgets", ["training.max_samples=100"], "are two budgets; set one of"),
    ("samples-zero", ["training.max_steps=null", "training.max_samples=0"], "max_samples=0 must"),
    ("lr-scaling", ["training.lr_scaling=cube"], "training.lr_scaling='cube' is not allowed"),
    (
        "default-budget",
        ["training.default_budget=epochs"],
        "training.default_budget='epochs' is not allowed",
    ),
    ("reference-zero", ["training.reference_batch=0"], "training.reference_batch=0 must be"),
    (
        "lr-scaled-above-1",
        ["training.lr_scaling=linear", "training.reference_batch=2", "training.lr=0.5"],
        "allowed: a scaled learning rate in (0, 1]",
    ),
    (
        "adaptive-steps",
        ["training.batch_schedule=adaptive"],
        "training.batch_schedule=adaptive grows the batch as the run goes, so its budget must be",
    ),
    (
        "adaptive-cap-below",
        ["training.batch_schedule=adaptive", "training.max_effective_batch=4"],
        "training.max_effective_batch=4 is below training.effective_batch_size=8",
    ),
    ("adaptive-word", ["training.batch_schedule=doubling"], "training.batch_schedule"),
    (
        "noise-one-micro",
        ["training.noise_scale=true", "training.micro_batch_size=8"],
        "is the whole effective batch",
    ),
    ("batch-zero", ["training.effective_batch_size=0"], "training.effective_batch_size=0"),
    ("hpo-without-study", ["hpo.n_trials=5"], "no study to set (hpo is null); add hpo=optuna"),
    ("batch-absurd", ["training.effective_batch_size=1000000000"], "GiB of token ids"),
    ("micro-above", ["training.micro_batch_size=64"], "larger than training.effective_batch"),
    # a value of the wrong shape, in the user's terms, with what to write (app/config/shapes.py)
    ("group-number", ["training=5"], "training=5 is not an option of 'training'; choose one of"),
    ("group-list", ["model=[1]"], "model=[1] is not an option of 'model'; choose one of"),
    ("group-two-presets", ["gpu=[cpu,h100]"], "gpu=[cpu,h100] is not an option of 'gpu'"),
    ("mapping-number", ["training.adaptive_batch=5"], "training.adaptive_batch takes a mapping"),
    ("list-word", ["data.paths=foo"], "data.paths takes a list, not a string; write data.paths="),
    ("number-list", ["training.lr=[1]"], "training.lr takes a number, not a list"),
    ("micro-word", ["training.micro_batch_size=big"], "must be auto or a positive integer"),
    ("eval-micro", ["training.eval_micro_batch_size=0"], "training.eval_micro_batch_size=0"),
    ("objective", ["objective=5"], "objective=5 must be a summary.json key or a list of them"),
    ("eval-every-zero", ["training.eval_every=0"], "training.eval_every=0"),
    ("keep-zero", ["training.keep_checkpoints=0"], "training.keep_checkpoints=0"),
    ("schedule", ["training.schedule=exponential"], "training.schedule='exponential'"),
    ("malloc", ["training.host_malloc=jemalloc"], "training.host_malloc='jemalloc'"),
    ("export-word", ["training.export=maybe"], "training.export:"),
    ("plus-unknown", ["+training.some_unknown_key=1"], "training.some_unknown_key: no such"),
    ("plus-unknown-root", ["+learning_rate=1"], "learning_rate: no such setting"),
    ("typo", ["training.lr_typo=1"], "training.lr_typo: no such setting in training"),
    ("wrong-type", ["training.max_steps=many"], "training.max_steps:"),
    ("probe-fraction", ["training.auto_batch.cpu_memory_fraction=0"], "cpu_memory_fraction=0"),
    ("probe-seconds", ["training.auto_batch.max_probe_seconds=inf"], "max_probe_seconds=inf"),
    # model
    ("heads", ["model.n_head=3"], "must be divisible by model.n_head=3"),
    ("layers-zero", ["model.n_layer=0"], "model.n_layer=0"),
    ("dropout-above", ["model.dropout=1.5"], "model.dropout=1.5"),
    ("dropout-nan", ["model.dropout=nan"], "model.dropout=nan"),
    ("model-absurd", ["model.n_layer=2000", "model.n_embd=8192"], "B parameters need"),
    ("arch", ["model.arch=rnn"], "model.arch='rnn' is not allowed"),
    ("attention", ["model.attn_implementation=magic"], "model.attn_implementation='magic'"),
    ("compile-mode", ["model.compile_mode=fast"], "model.compile_mode='fast'"),
    ("vocab-small", ["model.vocab_size=100"], "model.vocab_size=100 is smaller"),
    ("positions", ["model.max_position_embeddings=16"], "exceeds model.max_position_embed"),
    ("pretrained-missing", ["model=pretrained", "model.path=/nonexistent/model"], "model.path="),
    (
        "pretrained-positions",
        ["model=pretrained", "model.path={tmp}/gpt2", "data.seq_len=128"],
        "data.seq_len=128 exceeds the 64 positions of model.path=",
    ),
    (
        "pretrained-vocab",
        ["model=pretrained", "model.path={tmp}/gpt2", "data.tokenizer=train"],
        "data.tokenizer=train makes 2048 token ids but model.path=",
    ),
    (
        "pretrained-no-tokenizer",
        ["model=pretrained", "model.path={tmp}/weights-only"],
        "model.path has no tokenizer",
    ),
    # data
    ("seq-len-zero", ["data.seq_len=0"], "data.seq_len=0"),
    ("val-fraction", ["data.val_fraction=0.9"], "data.val_fraction=0.9"),
    ("docs-one", ["data.builtin_num_docs=1"], "data.builtin_num_docs=1"),
    ("workers", ["data.num_workers=-1"], "data.num_workers=-1"),
    ("source", ["data.source=ftp"], "data.source='ftp' is not allowed"),
    ("bpe-vocab", ["data.tokenizer=train", "data.tokenizer_vocab_size=100"], "vocab_size=100"),
    ("tokenizer-missing", ["data.tokenizer=/nonexistent/tok"], "data.tokenizer=/nonexistent"),
    ("no-files", ["data=text_files", "data.paths=[/nonexistent/*.txt]"], "data.paths"),
    ("binary-file", ["data=text_files", "data.paths=[{tmp}/data.bin]"], "is not text"),
    ("latin1-file", ["data=text_files", "data.paths=[{tmp}/latin1.txt]"], "not UTF-8 text"),
    ("group-option", ["data=imagenet"], "data=imagenet is not an option of 'data'"),
    # data through `datasets` (causal LM rows)
    ("rows-nothing", ["data=hf_text"], "data.source=datasets needs data.paths"),
    ("rows-no-file", ["data=hf_text", "data.paths=[/nonexistent/*.jsonl]"], "no file matches"),
    ("rows-extension", ["data=hf_text", "data.paths=[{tmp}/rows.xml]"], "file type '.xml'"),
    ("rows-empty", ["data=hf_text", "data.paths=[{tmp}/empty.jsonl]"], "train split is empty"),
    (
        "rows-column",
        ["data=hf_text", "data.paths=[{tmp}/rows.jsonl]", "data.text_column=body"],
        "data.text_column='body' is not a column of the train split; it has text, id",
    ),
    ("saved-missing", ["data=hf_text", "data.dataset=/nonexistent/saved"], "no such directory"),
    ("saved-empty", ["data=hf_text", "data.dataset={tmp}/saved_empty"], "train split is empty"),
    (
        "saved-column",
        ["data=hf_text", "data.dataset={tmp}/saved", "data.text_column=body"],
        "data.text_column='body' is not a column of the train split; it has text",
    ),
    ("map-procs", ["data.map_num_proc=0"], "data.map_num_proc=0 must be auto or an integer"),
    # device and precision
    ("gpu-unknown", ["gpu=rtx9090"], "gpu=rtx9090 is not an option of 'gpu'"),
    ("gpu-absent", ["gpu=rtx4090"], "needs a CUDA device"),
    ("fp16-on-cpu", ["precision=fp16"], "precision=fp16 needs a CUDA device"),
    ("bf16-on-t4", ["gpu=t4", "precision=bf16"], "precision=bf16 is not supported by gpu=t4"),
    ("headroom", ["gpu.memory_headroom=1.5"], "gpu.memory_headroom=1.5"),
    ("memory-limit", ["gpu.memory_limit_gib=-1"], "gpu.memory_limit_gib=-1.0 must be"),
    ("fault-phase", ["faults.oom_phase=never"], "faults.oom_phase='never'"),
    # profiler and trackers
    (
        "profile-after-end",
        ["training.profiler.steps=2", "training.profiler.start_step=6"],
        "training.profiler.start_step=6 is not a step of this run",
    ),
    ("profile-steps", ["training.profiler.steps=-1"], "training.profiler.steps=-1 must be"),
    ("wandb-mode", ["tracking.wandb.mode=cloud"], "tracking.wandb.mode='cloud' is not allowed"),
    ("alloc-conf", ["training.expandable_segments=maybe"], "training.expandable_segments"),
    # resume
    ("resume-missing", ["training.resume=/nonexistent/run"], "training.resume="),
    ("resume-shape", [RESUME, "model.n_embd=64"], "trained with model.n_embd=32"),
    ("resume-garbage", ["training.resume={tmp}/garbage.pt"], "is unreadable"),
    ("resume-pickle", ["training.resume={tmp}/pickled.pt"], "is unreadable"),
    ("resume-shards-pickle", ["training.resume={tmp}/step_00000001"], "is unreadable"),
    # parallelism
    ("parallelism", ["training.parallelism=zero3"], "training.parallelism='zero3' is not"),
    (
        "fsdp-adafactor",
        ["training.parallelism=fsdp", "training.optimizer=adafactor"],
        "training.optimizer=adafactor cannot step the sharded parameters",
    ),
    ("peer-timeout", ["training.peer_timeout_s=0"], "peer_timeout_s=0.0 must be a finite number"),
    ("fault-kill", ["faults.kill_in_checkpoint=0"], "faults.kill_in_checkpoint=0 must be"),
    # μP: a base width the width does not take, a family without its rules, weights not trained
    # under it, a checkpoint of another parametrization
    ("mup-no-base", ["model.parametrization=mup"], "model.mup.base_width is required"),
    (
        "mup-base-not-divisor",
        ["model.parametrization=mup", "model.mup.base_width=24"],
        "model.mup.base_width=24 must divide model.n_embd=32",
    ),
    (
        "mup-base-wider",
        ["model.parametrization=mup", "model.mup.base_width=64"],
        "model.mup.base_width=64 must divide model.n_embd=32 and be at most it",
    ),
    ("mup-word", ["model.parametrization=mu"], "model.parametrization='mu' is not allowed"),
    ("mup-output-mult", ["model.mup.output_mult=0"], "model.mup.output_mult=0.0 must be"),
    ("mup-head-dim", ["model.mup.base_head_dim=0"], "model.mup.base_head_dim=0 must be"),
    (
        "mup-family",
        ["experiment=nli_tiny", "model.parametrization=mup", "model.mup.base_width=32"],
        "model.arch=deberta_v2 has no μP rules",
    ),
    (
        "mup-pretrained",
        ["model=pretrained", "model.path={tmp}/gpt2", "model.parametrization=mup"],
        "a checkpoint's weights were not trained under them",
    ),
    (
        "resume-mup",
        [RESUME, "model.parametrization=mup", "model.mup.base_width=16"],
        "the checkpoint was trained with model.parametrization=standard, this run has "
        "model.parametrization=mup",
    ),
]


def _snapshot(*paths: Path) -> dict[str, str]:
    out = {}
    for root in paths:
        for p in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if p.is_file():
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[str(p)] = "dir"
    return out


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A completed run directory, as Hydra and the trainer leave it (checkpoint included)."""
    base = tmp_path_factory.mktemp("finished")
    train_here(*TINY, f"data.cache_dir={base / 'cache'}", f"hydra.run.dir={base / 'run'}")
    return base


@pytest.fixture(scope="module")
def saved_datasets(tmp_path_factory) -> Path:
    """Directories written by save_to_disk: one with rows, one empty."""
    import datasets

    base = tmp_path_factory.mktemp("saved")
    text = datasets.Features({"text": datasets.Value("string")})
    datasets.Dataset.from_dict({"text": ["a row of text"] * 4}, features=text).save_to_disk(
        str(base / "saved")
    )
    # One (empty) shard: with none, load_from_disk cannot open what save_to_disk wrote.
    datasets.Dataset.from_dict({"text": []}, features=text).save_to_disk(
        str(base / "saved_empty"), num_shards=1
    )
    return base


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """Local "pretrained" checkpoints: a GPT-2 of 64 positions with its BPE, and one without."""
    base = tmp_path_factory.mktemp("pretrained")
    save_tiny_gpt2(base / "gpt2")
    save_tiny_gpt2(base / "weights-only", tokenizer=False)
    return base


@pytest.fixture
def scratch(tmp_path, finished_run, saved_datasets, pretrained) -> Path:
    shutil.copytree(finished_run / "run", tmp_path / "run")
    for name in ("saved", "saved_empty"):
        shutil.copytree(saved_datasets / name, tmp_path / name)
    (tmp_path / "rows.jsonl").write_text(
        '{"text": "a row", "id": 1}\n{"text": "another", "id": 2}\n'
    )
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "rows.xml").write_text("<rows><row>text</row></rows>\n")
    for name in ("gpt2", "weights-only"):
        (tmp_path / name).symlink_to(pretrained / name)
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1") * 9)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    # A pickle the safe loader must refuse: an object torch's allowlist does not know.
    torch.save(
        {"model": {}, "step": 1, "payload": os.stat_result((0,) * 10)}, tmp_path / "pickled.pt"
    )
    # A sharded checkpoint whose index (DCP reads it with pickle) holds that object.
    shards = tmp_path / "step_00000001"
    shards.mkdir()
    torch.save({"optimizer": {}, "scheduler": {}, "step": 1, "rng": {}}, shards / "train_state.pt")
    (shards / ".metadata").write_bytes(pickle.dumps(os.stat_result((0,) * 10)))
    return tmp_path


def _assert_one_line(code: int, err: str, needle: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(("overrides", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_run_input_is_one_line_and_touches_nothing(
    overrides, needle, scratch, monkeypatch, capsys
):
    run_dir = scratch / "run"
    before = _snapshot(run_dir)
    argv = [
        *TINY,
        f"data.cache_dir={scratch / 'run-cache'}",
        f"hydra.run.dir={run_dir}",
        *(o.format(tmp=scratch) for o in overrides),
    ]
    code, _, err = invoke_here(argv, monkeypatch, capsys)
    _assert_one_line(code, err, needle)
    _assert_documented(overrides, err, scratch)
    assert _snapshot(run_dir) == before
    assert not (scratch / "run-cache").exists()  # no data was tokenized either


# Refusals that need the data or a tracker, so come after Hydra has written .hydra/ and its log
# into the run directory: app/run_dir_guard.py puts that back.
NLI = ["gpu=cpu", "experiment=nli_tiny", "training.micro_batch_size=2", "training.max_steps=3"]
LATE_CASES = [
    (
        "one-class",
        [*NLI, "data=hf_text", "data.paths=[{tmp}/one_class.jsonl]", "data.text_pair_column=hyp"],
        "holds one label ('yes') in the training split",
    ),
    ("nli-labels", [*NLI, "task.labels=[a,b,c]"], "task.labels"),
]


@pytest.mark.parametrize(
    ("overrides", "needle"), [c[1:] for c in LATE_CASES], ids=[c[0] for c in LATE_CASES]
)
@pytest.mark.parametrize("target", ["finished", "new"])
def test_a_refusal_after_hydra_started_leaves_the_run_dir_as_it_was(
    overrides, needle, target, scratch, monkeypatch, capsys
):
    run_dir = scratch / "run" if target == "finished" else scratch / "new" / "run"
    before = _snapshot(run_dir)
    rows = [f'{{"text": "premise {i}", "hyp": "h {i}", "label": "yes"}}' for i in range(40)]
    (scratch / "one_class.jsonl").write_text("\n".join(rows) + "\n")
    argv = [
        f"data.cache_dir={scratch / 'c'}",
        f"hydra.run.dir={run_dir}",
        *(o.format(tmp=scratch) for o in overrides),
    ]
    code, _, err = invoke_here(argv, monkeypatch, capsys)
    _assert_one_line(code, err, needle)
    assert _snapshot(run_dir) == before
    assert run_dir.exists() == (target == "finished")


SWEEP_CASES = [
    ("trials-zero", ["hpo.n_trials=0"], "hpo.n_trials=0"),
    ("budget-trials", ["hpo.budget_trials=0"], "hpo.budget_trials=0"),
    ("sampler-arg", ["hpo.sampler_args={n_startup:5}"], "hpo.sampler_args.n_startup"),
    ("direction", ["hpo.direction=up"], "hpo.direction='up'"),
    ("sampler", ["hpo.sampler=annealing"], "hpo.sampler='annealing'"),
    ("pruner", ["hpo.pruner=always"], "hpo.pruner='always'"),
    (
        "asha-factor",
        ["hpo.pruner=asha", "hpo.pruner_args={reduction_factor:1}"],
        "hpo.pruner_args.reduction_factor=1",
    ),
    ("budget-s", ["hpo.budget_s=-5"], "hpo.budget_s=-5"),
    ("max-resource", ["hpo.max_resource=0"], "hpo.max_resource=0 must be a positive integer"),
    ("declared-twice", ["hpo.max_resource=100"], "the job's config declares its schedule"),
    ("override-typo", ["training.lrr=0.1"], "training.lrr: no such setting"),
    ("sweep-option", ["model=gpt5"], "model=gpt5 is not an option"),
    ("fleet-workers", ["hpo.workers=0"], "hpo.workers=0 is not allowed"),
    ("fleet-split", ["hpo.devices=[0,1,2]", "hpo.gpus_per_trial=2"], "cannot be split"),
    ("fleet-seats", ["hpo.workers=3", "hpo.devices=[0,1]"], "hpo.workers=3 is more than"),
    ("fleet-memory", ["hpo.workers=2", "hpo.storage=memory"], "needs a study the workers share"),
    ("fleet-per-run", ["hpo.workers=2", "hydra.sweeper.n_trials=3"], "study-wide budget"),
    ("share-word", ["hpo.trials_per_gpu=foo"], "hpo.trials_per_gpu='foo' is not allowed"),
    ("share-most", ["hpo.max_trials_per_gpu=0"], "hpo.max_trials_per_gpu=0 is not allowed"),
    ("share-memory", ["hpo.gpu_memory_gib=-1"], "hpo.gpu_memory_gib=-1.0 is not allowed"),
    ("ranks-memory", ["hpo.gpus_per_trial=2", "hpo.storage=memory"], "needs a study its ranks"),
    ("sweep-cfg", ["--cfg", "job"], "to see a trial's config, run without -m"),
    (
        "warm-start-list",
        ["hpo.warm_start=[{storage: old.journal, study_name: old}]"],
        "for its list, write hpo.warm_start.studies=[{storage: old.journal, study_name: old}]",
    ),
    ("warm-start-word", ["hpo.warm_start=observe"], "hpo.warm_start takes a mapping of studies"),
    ("enqueue-mapping", ["hpo.enqueue={training.lr: 0.001}"], "hpo.enqueue takes a list"),
    ("params-list", ["hpo.params=[training.lr]"], "hpo.params takes a mapping"),
    # A μP proxy study and its target
    (
        "transfer-standard",
        ['hpo.transfer.target=["model.n_embd=64"]'],
        "under which the best learning rate moves with the width",
    ),
    ("transfer-run-alone", ["hpo.transfer.run=true"], "no hpo.transfer.target to run"),
    (
        "transfer-target",
        [
            "model.parametrization=mup",
            "model.mup.base_width=32",
            'hpo.transfer.target=["model.n_embd=48"]',
        ],
        "model.mup.base_width=32 must divide model.n_embd=48",
    ),
    (
        "transfer-head-width",
        [
            "model.parametrization=mup",
            "model.mup.base_width=32",
            'hpo.transfer.target=["model.n_head=1"]',
        ],
        "the target states μP's attention at head width 32 (model.mup.base_head_dim=null, its "
        "own head width), the trials at 16",
    ),
    (
        "study-other-parametrization",
        ["model.parametrization=mup", "model.mup.base_width=32"],
        "study 's' was run under model.parametrization=standard, this study under μP",
    ),
    (
        "warm-across",
        [
            "model.parametrization=mup",
            "model.mup.base_width=16",
            "hpo.study_name=new",
            "hpo.warm_start.studies=[{storage: {tmp}/study.journal, study_name: s}]",
        ],
        "was run under model.parametrization=standard, this study under μP at width 32",
    ),
]


@pytest.fixture
def study(tmp_path) -> Path:
    """An existing study with one finished trial, in the journal file a sweep would share."""
    from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

    path = tmp_path / "study.journal"
    existing = optuna.create_study(study_name="s", storage=journal(str(path)))
    existing.enqueue_trial({"x": 1.0})
    existing.optimize(lambda t: t.suggest_float("x", 0, 2), n_trials=1)
    return path


@pytest.mark.parametrize(
    ("overrides", "needle"), [c[1:] for c in SWEEP_CASES], ids=[c[0] for c in SWEEP_CASES]
)
def test_bad_sweep_input_is_one_line_and_leaves_the_study(
    overrides, needle, study, tmp_path, monkeypatch, capsys
):
    before = _snapshot(study)
    argv = [
        "-m",
        "hpo=optuna",
        *TINY,
        f"data.cache_dir={tmp_path / 'cache'}",
        "hpo.study_name=s",
        f"hpo.storage={study}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
        *(o.replace("{tmp}", str(tmp_path)) for o in overrides),
    ]
    code, _, err = invoke_here(argv, monkeypatch, capsys)
    _assert_one_line(code, err, needle)
    _assert_documented(overrides, err, tmp_path)
    assert _snapshot(study) == before
    assert list((tmp_path / "multirun").glob("*/.hydra")) == []  # no trial was started


def test_there_are_at_least_forty_distinct_cases():
    ids = [c[0] for c in CASES + SWEEP_CASES]
    assert len(set(ids)) == len(ids) >= 40
    assert len({tuple(c[1]) for c in CASES + SWEEP_CASES}) == len(ids)


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    """A directory this process cannot write: a read-only tmpfs as root, chmod otherwise."""
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        yield target
        target.chmod(0o755)
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)])
    if done.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)])


@pytest.mark.e2e
def test_a_read_only_output_directory_is_one_line(read_only_dir, tmp_path, monkeypatch, capsys):
    argv = [*TINY, f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={read_only_dir}/run"]
    code, _, err = invoke_here(argv, monkeypatch, capsys)
    _assert_one_line(code, err, "cannot write in")


def test_resuming_a_completed_run_is_a_no_op(scratch, monkeypatch, capsys):
    run_dir = scratch / "run"
    before = _snapshot(run_dir)
    argv = [*TINY, f"data.cache_dir={scratch / 'c'}", f"hydra.run.dir={run_dir}", RESUME]
    code, out, err = invoke_here(argv, monkeypatch, capsys)
    assert code == 0, err
    assert "the run is complete, nothing to do" in out
    assert _snapshot(run_dir) == before


DOCS_TABLE = Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md"
# A row of the table: | `overrides` | status | `the error line` (a note) |
DOCS_ROW = re.compile(r"^\| `([^`]+)` \| \d+ \| `([^`]+)`[^`|]*\|$", re.M)


def _documented() -> dict[str, str]:
    return {m.group(1): fill(m.group(2)) for m in DOCS_ROW.finditer(DOCS_TABLE.read_text())}


def _assert_documented(overrides: list[str], err: str, tmp: Path) -> None:
    """The table shows the line a user gets, as it is: `<dir>` for the scratch directory,
    `...` for what depends on the machine (its memory), `<pruners>` for the names of a kind
    (tests/kinds.py) as the project has them now."""
    shown = " ".join(o.replace("{tmp}", "<dir>") for o in overrides)
    rows = _documented()
    documented = rows.get(shown) or rows.get(f"-m hpo=optuna {shown}")
    assert documented is not None, f"docs/bad_inputs.md has no row for `{shown}`"
    line = next(ln for ln in err.splitlines() if ln.strip()).replace(str(tmp), "<dir>")
    pattern = ".*?".join(re.escape(part) for part in documented.split("..."))
    assert re.fullmatch(pattern, line), (
        f"docs/bad_inputs.md says\n  {documented}\nthe run says\n  {line}"
    )


def test_the_docs_table_lists_every_case():
    table = (Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md").read_text()
    for _, overrides, _ in CASES + SWEEP_CASES:
        shown = " ".join(o.replace("{tmp}", "<dir>") for o in overrides)
        assert f"`{shown}`" in table or f"`-m hpo=optuna {shown}`" in table, shown


def test_a_study_config_run_without_m_says_it_is_one_plain_run(capsys):
    from app.cli.preflight import preflight

    preflight(["hpo=optuna", *TINY])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("note: a study is configured (hpo) but -m is not given")
    assert "python -m app.train -m hpo=optuna" in line
    preflight(["-m", "hpo=optuna", *TINY])  # the study: no note
    preflight(TINY)  # no study: no note
    assert capsys.readouterr().err == ""
