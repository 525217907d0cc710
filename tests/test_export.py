"""The result users load: <run dir>/model in Hugging Face format, loaded and used by transformers
alone, continued with model=pretrained, and written again from any checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.cli.export import EXPORT_FILES, EXPORT_MARKER
from app.components.models.config import ModelConfig
from app.engine.records.summary import Summary
from app.engine.runner import run_training
from app.engine.saving import checkpoint as ckpt
from tests import procs
from tests.conftest import TINY, config, tiny, train_here

pytestmark = pytest.mark.integration

FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    EXPORT_MARKER,
}

# Loads an export with transformers alone, in a process that cannot import this project.
LOAD_AND_GENERATE = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[1])
prompt = "The cat"
inputs = tok(prompt, return_tensors="pt")
out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
batch = tok(["a", "longer prompt"], return_tensors="pt", padding=True)
model.generate(**batch, max_new_tokens=3, do_sample=False)
print(json.dumps({
    "ids": inputs["input_ids"][0].tolist(),
    "new": out[0, inputs["input_ids"].shape[1]:].tolist(),
    "text": tok.decode(out[0], skip_special_tokens=True),
    "eos": tok.eos_token_id,
    "generation": [model.generation_config.eos_token_id, model.generation_config.pad_token_id],
    "app_imported": any(m == "app" or m.startswith("app.") for m in sys.modules),
}))
"""

LOAD_CLASSIFIER = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[1])
batch = tok(["a man is sleeping"], ["a person rests"], return_tensors="pt", padding=True)
with torch.no_grad():
    logits = model(**batch).logits
print(json.dumps({
    "id2label": model.config.id2label,
    "shape": list(logits.shape),
    "ids": batch["input_ids"][0].tolist(),
}))
"""


def transformers_only(script: str, *args: str, cwd: Path) -> dict:
    """Run `script` where `app` cannot be imported: another directory, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "pad" not in proc.stderr, proc.stderr  # generate() had what it needs, no warning
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed tiny run through the real entrypoint (so it has .hydra/ too)."""
    base = tmp_path_factory.mktemp("export")
    train_here(*TINY, f"data.cache_dir={base / 'cache'}", f"hydra.run.dir={base / 'run'}")
    return base / "run"


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def _same_export(a: Path, b: Path) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        torch.testing.assert_close(tb[name], ta[name], rtol=0, atol=0, msg=name)
    for name in FILES - {"model.safetensors"}:
        assert json.loads((a / name).read_text()) == json.loads((b / name).read_text()), name


@pytest.mark.e2e
def test_a_run_leaves_a_model_that_transformers_alone_loads_and_generates_with(finished, tmp_path):
    model_dir = finished / "model"
    assert {p.name for p in model_dir.iterdir()} >= FILES
    assert Summary.read(finished).export_dir == str(model_dir)

    got = transformers_only(LOAD_AND_GENERATE, str(model_dir), cwd=tmp_path)
    assert not got["app_imported"]
    assert got["ids"] == list(b"The cat")  # the byte tokenizer's ids: byte values
    assert got["eos"] == 0  # the end-of-document token the model was trained with
    assert got["generation"] == [0, 0]  # generate() stops at it and pads with it
    assert len(got["new"]) > 0 and got["text"].startswith("The cat")

    # The weights are the final checkpoint's (tied embeddings are stored once).
    final = torch.load(ckpt.list_checkpoints(finished / "checkpoints")[-1], weights_only=True)
    exported = _tensors(model_dir)
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, final["model"][name], rtol=0, atol=0, msg=name)


def test_training_continues_from_the_export(finished, tmp_path):
    first = Summary.read(finished)
    cfg = config(tiny(tmp_path, "model=pretrained", f"model.path={finished / 'model'}"))
    assert cfg.data.tokenizer == str(finished / "model")  # its own tokenizer: the same ids
    summary = run_training(cfg, tmp_path / "run")
    assert summary.status == "completed"
    # The same weights on the same validation blocks: it starts where the first run ended.
    assert summary.initial_val["loss"] == pytest.approx(first.final_val["loss"], abs=1e-4)
    assert summary.final_val["loss"] < summary.initial_val["loss"]
    assert summary.warnings == []


@pytest.mark.e2e
def test_app_export_writes_the_same_files_from_the_checkpoint(finished, tmp_path):
    out = tmp_path / "again"
    proc = _export(str(finished), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    _same_export(finished / "model", out)


@pytest.mark.e2e
def test_an_old_checkpoint_without_its_config_exports_from_its_run_dir(finished, tmp_path):
    run = shutil.copytree(finished, tmp_path / "run", ignore=shutil.ignore_patterns("model"))
    path = ckpt.list_checkpoints(run / "checkpoints")[-1]
    state = torch.load(path, weights_only=True)
    del state["config"]  # as checkpoints were before they recorded it: .hydra/ tells instead
    del state["tokenizer_sha256"]  # nor their tokenizer: it is rebuilt from the data, unchecked
    torch.save(state, path)
    shutil.rmtree(run / "tokenizer")
    proc = _export(str(path))
    assert proc.returncode == 0, proc.stderr
    _same_export(finished / "model", run / "model")


@pytest.mark.e2e
def test_an_earlier_checkpoint_does_not_replace_the_final_export(finished, tmp_path):
    run = shutil.copytree(finished, tmp_path / "run")
    latest = ckpt.list_checkpoints(run / "checkpoints")[-1]
    earlier = run / "checkpoints" / "step_00000003.pt"
    state = torch.load(latest, weights_only=True)
    torch.save({**state, "step": 3}, earlier)
    assert _export(str(earlier)).returncode == 0
    assert (run / "model-step_00000003" / "model.safetensors").is_file()
    _same_export(finished / "model", run / "model")


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("missing", "no such file or directory"),
        ("empty", "no checkpoint there"),
        ("garbage.pt", "is not a readable checkpoint (a step_*.pt this trainer writes"),
    ],
)
@pytest.mark.e2e
def test_app_export_bad_input_is_one_line_and_exit_2(target, needle, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    proc = _export(str(tmp_path / target))
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


# --- --out: an earlier export is replaced, nothing else is ------------------------------------


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
    }


def _one_line_error(capsys, *args: str) -> str:
    """Run app.cli.export in this process (fast); it must exit 2 with one `error:` line."""
    from app.cli.export import main

    with pytest.raises(SystemExit) as exited:
        main(list(args))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exited.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize(
    ("out", "needle"),
    [
        ("run", "is the run directory"),
        ("run/checkpoints", "is or holds the checkpoint run/checkpoints/step_00000006.pt"),
        ("run/checkpoints/step_00000006.pt", "is or holds the checkpoint"),
        ("run/checkpoints/new", "is inside the checkpoints directory"),
        (".", "is or holds the checkpoint"),  # holds the run
        ("run/summary.json", "is a file"),
        ("run/summary.json/x", "run/summary.json is not a directory"),
        ("run/tensorboard", "is a directory that is not an earlier export"),
        ("run/tokenizer", "is a directory that is not an earlier export"),
        ("notes", "is a directory that is not an earlier export"),
        ("export_and_more", "is a directory that is not an earlier export"),
        ("base_model", "is a directory that is not an earlier export"),  # the files, no marker
        ("link", "is a symbolic link"),
    ],
)
def test_an_out_that_is_not_an_earlier_export_is_refused_touching_nothing(
    finished, tmp_path, monkeypatch, capsys, out, needle
):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    shutil.copytree(finished, tmp_path / "run")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    shutil.copytree(finished / "model", tmp_path / "export_and_more")
    (tmp_path / "export_and_more" / "results.csv").write_text("mine too")
    shutil.copytree(finished / "model", tmp_path / "base_model")  # as a downloaded model has
    (tmp_path / "base_model" / EXPORT_MARKER).unlink()
    (tmp_path / "link").symlink_to(tmp_path / "run" / "model")
    before = _snapshot(tmp_path)
    line = _one_line_error(capsys, "run", "--out", out)
    assert needle in line and f"--out {out}" in line, line
    assert _snapshot(tmp_path) == before


def test_an_earlier_export_or_an_empty_directory_is_replaced(finished, tmp_path, capsys):
    from app.cli.export import main

    run = shutil.copytree(finished, tmp_path / "run")
    (run / "model" / "model.safetensors").write_bytes(b"an earlier export, replaced")
    (run / "model" / EXPORT_MARKER).unlink()  # the run's own, from before the marker
    main([str(run)])  # the default, <run dir>/model, holds the run's own export
    (tmp_path / "empty").mkdir()
    main([str(run), "--out", str(tmp_path / "empty")])
    earlier = shutil.copytree(finished / "model", tmp_path / "earlier")
    (earlier / "model.safetensors").write_bytes(b"an earlier export elsewhere, replaced")
    main([str(run), "--out", str(earlier)])
    for out in (run / "model", tmp_path / "empty", earlier):
        _same_export(finished / "model", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["earlier", "empty", "run"]


# --- the tokenizer the run trained with, whatever the data is now -----------------------------


def _corpus(seed: int) -> str:
    from app.components.data.lm.corpus import generate_corpus

    return "\n\n".join(generate_corpus(150, seed))


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory) -> Path:
    """A completed tiny run on a text file with a BPE trained on it (vocab 300)."""
    base = tmp_path_factory.mktemp("bpe")
    (base / "corpus.txt").write_text(_corpus(0))
    overrides = [
        "data=text_files",
        f"data.paths=[{base / 'corpus.txt'}]",
        "data.tokenizer=train",
        "data.tokenizer_vocab_size=300",
        "training.max_steps=3",
    ]
    summary = run_training(config(tiny(base, *overrides)), base / "run")
    assert summary.status == "completed"
    return base


def _bpe_copy(bpe_run: Path, tmp_path: Path) -> Path:
    """The run and its data where this test may change them (the config names the data by
    its absolute path: the copy keeps it, the test changes bpe_run's file and restores it)."""
    return shutil.copytree(
        bpe_run / "run", tmp_path / "run", ignore=shutil.ignore_patterns("model")
    )


@pytest.fixture
def changed_data(bpe_run):
    """The training file with other text: a BPE trained on it now is another one."""
    corpus = bpe_run / "corpus.txt"
    original = corpus.read_text()
    corpus.write_text(_corpus(1))
    yield corpus
    corpus.write_text(original)


def test_a_run_saves_its_tokenizer_and_each_checkpoint_names_it(bpe_run):
    from app.components.data.lm.hf_tokenizer import fingerprint_json

    saved = (bpe_run / "run" / "tokenizer" / "tokenizer.json").read_text()
    assert saved == (bpe_run / "run" / "model" / "tokenizer.json").read_text()
    for path in ckpt.list_checkpoints(bpe_run / "run" / "checkpoints"):
        assert torch.load(path, weights_only=True)["tokenizer_sha256"] == fingerprint_json(saved)


@pytest.mark.e2e
def test_the_export_pairs_the_weights_with_the_runs_tokenizer_after_the_data_changed(
    bpe_run, changed_data, tmp_path
):
    run = _bpe_copy(bpe_run, tmp_path)
    assert _export(str(run)).returncode == 0
    _same_export(bpe_run / "run" / "model", run / "model")


@pytest.mark.e2e
def test_the_export_needs_no_data_when_the_run_saved_its_tokenizer(bpe_run, tmp_path):
    run = _bpe_copy(bpe_run, tmp_path)
    corpus = bpe_run / "corpus.txt"
    moved = corpus.rename(tmp_path / "corpus.txt")
    try:
        proc = _export(str(run))
    finally:
        moved.rename(corpus)
    assert proc.returncode == 0, proc.stderr
    _same_export(bpe_run / "run" / "model", run / "model")


def test_a_rebuilt_tokenizer_that_is_not_the_runs_is_refused(
    bpe_run, changed_data, tmp_path, capsys
):
    run = _bpe_copy(bpe_run, tmp_path)
    shutil.rmtree(run / "tokenizer")  # as for a checkpoint copied away from its run
    before = _snapshot(tmp_path)
    line = _one_line_error(capsys, str(run))
    assert "is not the one the run trained with" in line, line
    assert _snapshot(tmp_path) == before


def test_without_its_tokenizer_or_its_data_the_export_says_it_needs_the_data(
    bpe_run, tmp_path, capsys
):
    run = _bpe_copy(bpe_run, tmp_path)
    shutil.rmtree(run / "tokenizer")
    corpus = bpe_run / "corpus.txt"
    moved = corpus.rename(tmp_path / "corpus.txt")
    try:
        line = _one_line_error(capsys, str(run))
    finally:
        moved.rename(corpus)
    assert "holds no saved tokenizer of this checkpoint" in line and "data.paths" in line, line
    assert not (run / "model").exists()


def _export(*args: str) -> subprocess.CompletedProcess:
    return procs.run(
        [procs.PY, "-m", "app.export", *args], env=procs.environment(HF_HUB_OFFLINE="1")
    )


# --- atomic: complete or absent, an old export replaced safely --------------------------------


def _tiny_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=16, n_embd=8, n_layer=1, n_head=2)
    )


# What _tiny_model is built from, as write_export takes it (the standard parametrization)
TINY_MODEL = ModelConfig(name="tiny", n_layer=1, n_head=2, n_embd=8, max_position_embeddings=16)


def test_a_failed_export_leaves_the_old_one_whole_and_no_temporaries(tmp_path, monkeypatch):
    from app.cli.export import write_export
    from app.components.data.lm.hf_tokenizer import byte_tokenizer

    out = tmp_path / "model"
    write_export(_tiny_model(), byte_tokenizer(), out, TINY_MODEL)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    tok = byte_tokenizer()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tok, "save_pretrained", full_disk)
    with pytest.raises(OSError):
        write_export(_tiny_model(), tok, out, TINY_MODEL)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_new_export_replaces_the_old_and_clears_a_killed_ones_leftovers(tmp_path):
    from app.cli.export import write_export
    from app.components.data.lm.hf_tokenizer import byte_tokenizer

    out = tmp_path / "model"
    write_export(_tiny_model(), byte_tokenizer(), out, TINY_MODEL)
    (out / "stray.txt").write_text("from the old export")
    (tmp_path / ".model.dead.tmp").mkdir()  # a kill between writing and renaming
    write_export(_tiny_model(), byte_tokenizer(), out, TINY_MODEL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    # What every supported transformers writes, and nothing an export does not own (before
    # transformers 5 the tokenizer adds special_tokens_map.json).
    assert FILES <= {p.name for p in out.iterdir()} <= EXPORT_FILES | {EXPORT_MARKER}


def test_export_off_writes_no_model(tmp_path):
    summary = run_training(config(tiny(tmp_path, "training.export=false")), tmp_path / "run")
    assert summary.status == "completed" and summary.export_dir is None
    assert not (tmp_path / "run" / "model").exists()


class Wrapped(torch.nn.Module):
    """What DDP (`module.`) and torch.compile (`_orig_mod.`) do to a model: wrap it."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_a_wrapped_model_exports_its_plain_weights(tmp_path, monkeypatch):
    import app.engine.parallel.wrap

    monkeypatch.setattr(app.engine.parallel.wrap, "maybe_compile", lambda model, *a: Wrapped(model))
    summary = run_training(config(tiny(tmp_path, "training.max_steps=2")), tmp_path / "run")
    names = set(_tensors(Path(summary.export_dir)))
    assert names and all(n.startswith(("transformer.", "lm_head.")) for n in names), names


# --- classification ---------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_a_classifier_export_loads_with_auto_model_for_sequence_classification(tmp_path):
    from app.components.tasks import build_task
    from tests.test_classification import nli

    cfg = config(nli(tmp_path))
    summary = run_training(cfg, tmp_path / "run")
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(summary.export_dir))
    got = transformers_only(LOAD_CLASSIFIER, summary.export_dir, cwd=tmp_path)
    assert got["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
    assert got["shape"] == [1, 3]
    # The pair is encoded as in training: the run's BPE, [CLS] a [SEP] b [SEP].
    trained_with = build_task(cfg.task).export_tokenizer(cfg.data)
    assert got["ids"] == trained_with("a man is sleeping", "a person rests")["input_ids"]
