"""Sequence classification: exact effective batch on padded pairs, length grouping, resume,
labelled data from files and datasets, metrics, and bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.components.data.labelled.padded import PaddedRows, padded_length
from app.components.data.loader import StepDataset, step_sample_indices
from app.components.hardware.precision import PrecisionPlan
from app.components.models.families import MODELS
from app.components.models.heads import SEQUENCE_CLASSIFIER
from app.components.schedule import build_scheduler
from app.components.tasks.base import TaskData
from app.components.tasks.classification import SequenceClassification
from app.config import ModelConfig, TaskConfig, TrainingConfig
from app.config.budget import budget_of
from app.engine.batch_plan import BatchPlan
from app.engine.records.summary import Summary
from app.engine.run import Run
from app.engine.runner import run_training
from app.engine.saving import checkpoint as ckpt
from app.engine.train.step import train_step
from tests import procs
from tests.conftest import config

pytestmark = pytest.mark.integration

FP32 = PrecisionPlan("fp32", None, False, False, "test")
# The tiny NLI experiment, shrunk to seconds on two shared cores.
NLI = [
    "experiment=nli_tiny",
    "gpu=cpu",
    "data.builtin_num_docs=600",
    "data.max_length=64",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.intermediate_size=64",
    "training.effective_batch_size=8",
    "training.micro_batch_size=4",
    "training.max_steps=6",
    "training.eval_every=3",
    "training.log_every=1",
    "training.eval_samples=16",
    "training.warmup_steps=2",
    "training.progress_bar=false",
]


def nli(tmp_path: Path, *extra: str) -> list[str]:
    return [*NLI, f"data.cache_dir={tmp_path / 'cache'}", *extra]


# --- one optimizer step: the same whatever the split --------------------------------------


def _rows(n: int = 32, width: int = 24, vocab: int = 50, seed: int = 0) -> PaddedRows:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (n,), generator=gen, dtype=torch.int32)
    ids = torch.randint(3, vocab, (n, width), generator=gen, dtype=torch.int32)
    types = torch.zeros((n, width), dtype=torch.int8)
    for i, length in enumerate(lengths.tolist()):
        ids[i, length:] = 0  # padding
        types[i, length // 2 : length] = 1  # a second segment
    labels = torch.randint(0, 3, (n,), generator=gen)
    return PaddedRows(ids, types, lengths, labels)


def _classifier(arch: str = "bert", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = ModelConfig(name="t", arch=arch, n_layer=1, n_head=2, n_embd=32, max_position_embeddings=32)
    empty = torch.empty(0)
    data = TaskData(empty, empty, 50, "test", pad_id=0, info={"labels": ["a", "b", "c"]})
    return MODELS.get(arch).build(m, data, SequenceClassification())


def _step(
    micro: int, arch: str, smoothing: float = 0.1, task_class: type = SequenceClassification
) -> dict[str, torch.Tensor]:
    model = _classifier(arch)
    tcfg = TrainingConfig(lr=1e-2, warmup_steps=0, max_grad_norm=0.0)
    # SGD with lr 1: the step is the gradient itself, so any normalization error shows.
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    task = task_class(TaskConfig(name="classification", label_smoothing=smoothing))
    run = Run(
        model=model,
        raw_model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, budget_of(tcfg, None)),
        plan=BatchPlan(effective_batch_size=32, micro_batch_size=micro),
        precision=FP32,
        device=torch.device("cpu"),
        cfg=tcfg,
        steps=iter(()),
        val_blocks=_rows(4),
        run_dir=None,
        task=task,
        budget=budget_of(tcfg, None),
    )
    train_step(run, _rows(), step=0)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# Every family built from sizes with a classifier head (a new one too)
CLASSIFIERS = [f.name for f in MODELS.all() if SEQUENCE_CLASSIFIER in f.heads]


@pytest.mark.parametrize("arch", CLASSIFIERS)
def test_one_step_on_padded_pairs_is_the_same_for_any_split(arch):
    whole = _step(32, arch)
    for micro in (8, 5):  # 8 x 4 and the uneven 5,5,5,5,4,4,4
        other = _step(micro, arch)
        for name, value in whole.items():
            torch.testing.assert_close(other[name], value, rtol=1e-5, atol=1e-6, msg=name)


class MeanPerMicroBatch(SequenceClassification):
    """The old Trainer bug: each micro-batch averaged on its own, then the averages averaged
    (32 samples split 5,5,5,5,4,4,4: seven micro-batches)."""

    def loss_sum(self, model, inputs, targets):
        return super().loss_sum(model, inputs, targets) / len(targets) * 32 / 7


def test_a_mean_per_micro_batch_would_differ():
    """The check above can fail: dividing each micro-batch by its own size moves the step."""
    whole = _step(32, "bert")
    buggy = _step(5, "bert", task_class=MeanPerMicroBatch)
    assert any(not torch.allclose(buggy[k], whole[k], rtol=1e-5, atol=1e-6) for k in whole)


def test_micro_batches_are_padded_to_their_own_longest_row_in_multiples_of_8():
    task = SequenceClassification()
    rows = _rows()
    x, y = task.inputs_and_targets(rows)
    parts = list(task.micro_batches(x, y, [8, 8, 8, 8]))
    assert sum(len(p[1]) for p in parts) == 32
    widths = [p[0].input_ids.shape[1] for p in parts]
    assert widths == sorted(widths, reverse=True)  # longest first
    for inputs, _ in parts:
        assert inputs.input_ids.shape[1] == padded_length(int(inputs.lengths.max()), 24)
        assert inputs.input_ids.shape[1] % 8 == 0 or inputs.input_ids.shape[1] == 24


# --- length-grouped sampling --------------------------------------------------------------


def _padded_tokens(sizes: torch.Tensor, per_step: int, micro: int, steps: int, **kw) -> int:
    task = SequenceClassification()
    n = len(sizes)
    rows = PaddedRows(
        torch.zeros((n, 128), dtype=torch.int32), None, sizes, torch.zeros(n, dtype=torch.long)
    )
    dataset = StepDataset(rows, per_step, seed=3, **kw)
    total = 0
    for step in range(steps):
        x, y = task.inputs_and_targets(dataset[step])
        sizes = [micro] * (per_step // micro)
        total += sum(part.input_ids.numel() for part, _ in task.micro_batches(x, y, sizes))
    return total


def test_length_grouping_cuts_padding_and_keeps_every_sample_once_per_epoch():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 129, (3200,), generator=gen, dtype=torch.int32)  # mixed lengths
    per_step, steps = 32, 100  # one epoch
    plain = _padded_tokens(lengths, per_step, 8, steps)
    grouped = _padded_tokens(lengths, per_step, 8, steps, lengths=lengths, group_steps=50)
    real = int(lengths.sum())
    assert grouped < plain
    ratio = (plain - real) / (grouped - real)  # padding tokens: plain over grouped
    assert ratio > 3, ratio  # measured: 4.3 (lengths uniform in 8..128, micro-batches of 8)
    rows = PaddedRows(torch.zeros((3200, 1), dtype=torch.int32), None, lengths, lengths.long())
    ds = StepDataset(rows, per_step, seed=3, lengths=lengths, group_steps=50)
    seen = torch.cat([ds.step_indices(s) for s in range(steps)])
    assert sorted(seen.tolist()) == list(range(3200))  # the same samples, each once


def test_the_grouped_order_is_a_pure_function_of_seed_and_step():
    lengths = torch.randint(1, 50, (100,), generator=torch.Generator().manual_seed(1))
    rows = PaddedRows(torch.zeros((100, 1), dtype=torch.int32), None, lengths, lengths.long())
    a = StepDataset(rows, 8, seed=5, lengths=lengths, group_steps=3)
    first = [a.step_indices(s) for s in range(40)]
    b = StepDataset(rows, 8, seed=5, lengths=lengths, group_steps=3)
    for step in (37, 13, 2, 25):  # any order, a fresh dataset: the same samples
        assert torch.equal(b.step_indices(step), first[step])
    plain = step_sample_indices(100, 8, 2, 5)
    assert not torch.equal(plain, first[2])  # grouping does change the order


# --- end to end ------------------------------------------------------------------------------


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt.list_checkpoints(run_dir / "checkpoints")[-1], weights_only=True)[
        "model"
    ]


def test_stop_and_resume_with_length_grouping_gives_identical_parameters(tmp_path):
    from app.core.outcomes import TrainingOOM

    base = nli(tmp_path, "training.checkpoint_every=3", "model.dropout=0.1")
    straight = run_training(config(base), tmp_path / "straight")
    assert straight.status == "completed" and straight.task == "classification"
    crash = [
        "faults.oom_above_micro_batch=0",
        "faults.oom_from_step=3",
        "training.auto_batch.oom_recovery=false",
    ]
    with pytest.raises(TrainingOOM):
        run_training(config([*base, *crash]), tmp_path / "first")
    resumed = run_training(
        config([*base, f"training.resume={tmp_path / 'first'}"]), tmp_path / "second"
    )
    assert resumed.resumed_from_step == 3
    a, b = _final_model(tmp_path / "straight"), _final_model(tmp_path / "second")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    assert resumed.final_val["accuracy"] == straight.final_val["accuracy"]


def test_a_run_reports_accuracy_f1_and_the_label_mapping(tmp_path):
    summary = run_training(config(nli(tmp_path)), tmp_path / "run").to_json()
    for key in ("final_val_loss", "final_val_accuracy", "final_val_f1", "initial_val_accuracy"):
        assert 0 <= summary[key] <= 5, key
    assert summary["labels"] == ["entailment", "neutral", "contradiction"]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert any("val/accuracy" in r and "val/f1" in r for r in rows)


def test_an_oom_at_micro_batch_1_ends_in_status_oom(tmp_path):
    from app.core.outcomes import TrainingOOM

    cfg = config(nli(tmp_path, "training.micro_batch_size=auto", "faults.oom_above_micro_batch=0"))
    with pytest.raises(TrainingOOM):
        run_training(cfg, tmp_path / "run")
    assert Summary.read(tmp_path / "run").status == "oom"


@pytest.mark.e2e
@pytest.mark.slow
def test_an_accuracy_study_samples_the_batch_scores_accuracy_and_prunes_an_oom(tmp_path):
    """The issue's command, shrunk: trials sample the effective batch, each trial's value is its
    validation accuracy (maximized), and a trial that runs out of memory even at micro-batch 1
    is PRUNED with reason oom while the study goes on."""

    import optuna

    from hydra_plugins.hydratrain_optuna_sweeper._study._storage import journal

    batch = "training.effective_batch_size:'choice(8, 16)'"
    space = f"{{{batch},faults.oom_above_micro_batch:'choice(64, 0)'}}"
    oom_first = "[{training.effective_batch_size:8,faults.oom_above_micro_batch:0}]"
    # A plain key=value on the command line fixes a key: leave the batch to the sampler.
    sampled = [a for a in nli(tmp_path) if not a.startswith("training.effective_batch_size=")]
    cmd = [
        *("-m", "hpo=optuna", *sampled),
        "hpo.metric=final_val_accuracy",
        "hpo.direction=maximize",
        "hpo.report_metric=val_accuracy",
        "hpo.n_trials=6",
        "hpo.study_name=nli",
        f"hpo.storage={tmp_path}/study.journal",
        "hpo.tensorboard=false",
        f"hpo.enqueue={oom_first}",
        f"hydra.sweeper.params={space}",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    procs.run([*procs.TRAIN, *cmd], timeout=600, check=True)
    study = optuna.load_study(study_name="nli", storage=journal(f"{tmp_path}/study.journal"))
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    trials = study.get_trials()
    assert len(trials) == 6 and all(t.state.is_finished() for t in trials)
    assert {t.params["training.effective_batch_size"] for t in trials} <= {8, 16}
    oom = trials[0]
    assert oom.state == optuna.trial.TrialState.PRUNED and oom.user_attrs["reason"] == "oom"
    for t in trials:
        if t.params["faults.oom_above_micro_batch"] == 0:
            assert t.user_attrs["reason"] == "oom"
            continue
        summary = Summary.read(t.user_attrs["run_dir"])
        assert t.user_attrs["effective_batch_size"] == t.params["training.effective_batch_size"]
        # What the pruner saw at each evaluation is the accuracy, not the loss (no step-0
        # evaluation in a trial: hpo=optuna skips it).
        assert set(t.intermediate_values) == {3, 6}
        assert all(0.0 <= v <= 1.0 for v in t.intermediate_values.values())
        if t.state == optuna.trial.TrialState.COMPLETE:
            assert t.value == pytest.approx(summary.final_val["accuracy"])
            assert t.intermediate_values[6] == pytest.approx(summary.final_val["accuracy"])


# --- labelled data from files and datasets -----------------------------------------------


def _write_rows(tmp_path: Path, n: int = 300) -> list[dict]:
    from app.components.data.labelled.nli_corpus import generate_nli

    return [
        {"sentence1": r["premise"], "sentence2": r["hypothesis"], "gold": r["label"]}
        for r in generate_nli(n, seed=9)
    ]


MNLI_COLUMNS = [
    "data.source=datasets",
    "data.text_column=sentence1",
    "data.text_pair_column=sentence2",
    "data.label_column=gold",
]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_labelled_files_train(fmt, tmp_path):
    import datasets

    rows = _write_rows(tmp_path)
    path = tmp_path / f"train.{fmt}"
    table = datasets.Dataset.from_list(rows)
    {"jsonl": table.to_json, "csv": table.to_csv, "parquet": table.to_parquet}[fmt](str(path))
    summary = run_training(
        config(nli(tmp_path, *MNLI_COLUMNS, f"data.paths=[{path}]")), tmp_path / "run"
    )
    assert summary.status == "completed"
    assert summary.task_fields["labels"] == [
        "contradiction",
        "entailment",
        "neutral",
    ]  # sorted strings


def test_a_saved_dataset_dict_with_class_labels_and_its_own_validation_split(tmp_path):
    import datasets

    rows = _write_rows(tmp_path, 400)
    names = ["entailment", "neutral", "contradiction"]
    features = datasets.Features(
        {
            "sentence1": datasets.Value("string"),
            "sentence2": datasets.Value("string"),
            "gold": datasets.ClassLabel(names=names),
        }
    )
    table = datasets.Dataset.from_list(
        [{**r, "gold": names.index(r["gold"])} for r in rows], features=features
    )
    split = table.train_test_split(test_size=0.25, seed=0)
    dd = datasets.DatasetDict({"train": split["train"], "validation_matched": split["test"]})
    dd.save_to_disk(str(tmp_path / "mnli"))
    extra = [f"data.dataset={tmp_path / 'mnli'}", "data.val_split=validation_matched"]
    summary = run_training(config(nli(tmp_path, *MNLI_COLUMNS, *extra)), tmp_path / "run")
    assert summary.task_fields["labels"] == names  # the ClassLabel's order, not sorted


# --- bad input: one line, before any training --------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["data.text_pair_column=hypo"], "data.text_pair_column='hypo' is not a column"),
        (["task.labels=[yes,no,maybe]"], "is not one of task.labels"),
        (["data.max_length=512"], "data.max_length=512 exceeds model.max_position_embeddings"),
        (["model.arch=gpt2"], "model.arch='gpt2' is a causal LM, not a model for task="),
        (["data.source=text_files"], "data.source='text_files' does not serve task="),
        (["task.label_smoothing=1.0"], "task.label_smoothing=1.0 must be"),
    ],
)
@pytest.mark.e2e
def test_bad_classification_input_is_one_line_before_training(extra, needle, tmp_path):
    proc = procs.train(*nli(tmp_path, *extra), f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.e2e
def test_an_empty_split_is_one_line(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps(r) for r in _write_rows(tmp_path, 20)) + "\n"
    )
    extra = [
        *MNLI_COLUMNS,
        f"data.paths=[{tmp_path}/train.jsonl]",
        f"data.val_paths=[{tmp_path}/empty.jsonl]",
    ]
    proc = procs.train(*nli(tmp_path, *extra), f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    assert "validation" in proc.stderr and "Traceback" not in proc.stderr
