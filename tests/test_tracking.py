"""W&B (offline) and MLflow (local store) receive what TensorBoard gets, the config and the
plan; every run is one tracker run, finished however it ends; a missing library is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.components.tracking import TRACKERS, tracked_config
from app.components.tracking.base import Sink
from app.core.outcomes import TrainingOOM
from app.engine.records.telemetry import RunLogger
from app.engine.runner import run_training
from tests import procs
from tests.conftest import TINY, compose, config, tiny

pytestmark = pytest.mark.integration


def logged(run_dir: Path, key: str) -> list[tuple[int, float]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(x["step"], x[key]) for x in lines if key in x]


def with_trackers(tmp: Path, *extra: str) -> list[str]:
    return tiny(
        tmp,
        "tracking.wandb.enabled=true",
        "tracking.mlflow.enabled=true",
        f"tracking.mlflow.tracking_uri=sqlite:///{tmp}/mlflow/mlflow.db",
        "tracking.mlflow.experiment=tests",
        *extra,
    )


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """Two runs in one process, as a sweep's trials under Hydra's basic launcher: one that
    completes, one that ends in an OOM at micro-batch 1."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    tmp = tmp_path_factory.mktemp("tracked")
    done = run_training(config(with_trackers(tmp)), tmp / "done")
    assert done.status == "completed"
    failing = with_trackers(tmp, "faults.oom_above_micro_batch=0", "faults.oom_from_step=2")
    with pytest.raises(TrainingOOM):
        run_training(config(failing), tmp / "oom")
    return tmp


def mlflow_runs(tmp: Path) -> dict[str, object]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow/mlflow.db")
    experiment = client.get_experiment_by_name("tests")
    runs = client.search_runs([experiment.experiment_id])
    return client, {Path(r.data.tags["run_dir"]).name: r for r in runs}


@pytest.mark.e2e  # `tracked` runs W&B, whose service is a program (wandb-core)
def test_mlflow_run_has_the_scalars_config_and_plan(tracked):
    client, runs = mlflow_runs(tracked)
    run = runs["done"]
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == logged(tracked / "done", "train/loss")
    val = client.get_metric_history(run.info.run_id, "val/loss")
    assert [(m.step, m.value) for m in val] == logged(tracked / "done", "val/loss")
    params = run.data.params
    assert params["training.max_steps"] == "6" and params["model.n_embd"] == "32"
    assert params["batch_plan.micro_batch_size"] == "4"
    assert params["batch_plan.grad_accum_steps"] == "2"
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "completed"


@pytest.mark.e2e  # `tracked` runs W&B, whose service is a program (wandb-core)
def test_each_run_is_its_own_mlflow_run_and_a_failed_one_is_closed(tracked):
    client, runs = mlflow_runs(tracked)
    assert set(runs) == {"done", "oom"}
    assert runs["done"].info.run_id != runs["oom"].info.run_id
    assert runs["oom"].info.status == "FAILED" and runs["oom"].data.tags["status"] == "oom"
    steps = [m.step for m in client.get_metric_history(runs["oom"].info.run_id, "train/loss")]
    assert steps == [1, 2]  # nothing of the first run leaked into it


def wandb_file(run_dir: Path) -> Path:
    (found,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return found


@pytest.mark.e2e  # `tracked` runs W&B, whose service is a program (wandb-core)
def test_wandb_offline_run_has_the_scalars_config_and_plan(tracked):
    from tests import wandb_reader

    path = wandb_file(tracked / "done")
    rows = wandb_reader.history(path)
    train = [(r["_step"], r["train/loss"]) for r in rows if "train/loss" in r]
    assert train == logged(tracked / "done", "train/loss")
    val = [(r["_step"], r["val/loss"]) for r in rows if "val/loss" in r]
    assert val == logged(tracked / "done", "val/loss")
    config = wandb_reader.config(path)
    assert config["training"]["max_steps"] == 6 and config["model"]["n_embd"] == 32
    assert config["batch_plan"]["micro_batch_size"] == 4
    assert wandb_reader.exit_code(path) == 0


@pytest.mark.e2e  # `tracked` runs W&B, whose service is a program (wandb-core)
def test_each_run_is_its_own_wandb_run_and_a_failed_one_is_finished(tracked):
    from tests import wandb_reader

    done, oom = wandb_file(tracked / "done"), wandb_file(tracked / "oom")
    assert done.name != oom.name
    assert wandb_reader.exit_code(oom) == 1
    steps = [r["_step"] for r in wandb_reader.history(oom) if "train/loss" in r]
    assert steps == [1, 2]


@pytest.mark.e2e
@pytest.mark.parametrize("tracker", TRACKERS.all(), ids=lambda t: t.name)
def test_a_tracker_whose_library_is_missing_is_one_line_before_work(tmp_path, tracker):
    run_dir = tmp_path / "run"
    key, module = tracker.name, tracker.module
    args = [*TINY, f"tracking.{key}.enabled=true", f"hydra.run.dir={run_dir}"]
    code = (
        f"import runpy, sys; sys.modules[{module!r}] = None; sys.argv = ['app.train', *{args!r}]; "
        "runpy.run_module('app.train', run_name='__main__', alter_sys=True)"
    )
    proc = procs.run([procs.PY, "-c", code])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: tracking.{key}.enabled=true needs the {module}")
    assert f'pip install -e ".[{tracker.extra}]"' in lines[0]
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tracking.wandb.mode=cloud", "tracking.wandb.mode='cloud' is not allowed"),
        ("tracking.mlflow.experiment=''", "tracking.mlflow.experiment='' must not be empty"),
        ("tracking.wandb.project=' '", "tracking.wandb.project=' ' must not be empty"),
    ],
)
def test_tracking_settings_are_validated(override, message):
    from app.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(compose([*TINY, override]))


def test_tracked_config_is_resolved_and_masks_passwords():
    storage = "postgresql://me:s3cret@db/optuna"
    cfg = config([*TINY, "hpo=optuna", f"hpo.storage={storage}"])
    tracked = tracked_config(cfg)
    assert tracked["hpo"]["storage"] == "postgresql://me:***@db/optuna"
    # resolved: hpo.study_name is ${model.name}-${data.name} in conf/hpo/optuna.yaml
    assert tracked["hpo"]["study_name"] == "tiny_gpt2-tiny_corpus"
    assert tracked["training"]["lr"] == cfg.training.lr


class Recording(Sink):
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def scalars(self, step, values):
        self.calls.append(("scalars", step, values))

    def close(self, summary):
        self.calls.append(("close", summary))


class Broken(Sink):
    name = "broken"

    def scalars(self, step, values):
        raise OSError("no space left on device")


def test_run_logger_fans_out_and_drops_a_failing_sink(tmp_path, caplog):
    good, broken = Recording(), Broken()
    logger = RunLogger(tmp_path, sinks=[broken, good])
    logger.log(1, {"train/loss": 2.0, "train/mfu": None})
    logger.log(2, {"train/loss": 1.5})
    logger.close({"status": "completed"})
    assert good.calls == [
        ("scalars", 1, {"train/loss": 2.0}),
        ("scalars", 2, {"train/loss": 1.5}),
        ("close", {"status": "completed"}),
    ]
    assert "broken is no longer written: no space left on device" in caplog.text


def test_an_artifact_location_mlflow_cannot_store_to_is_refused_before_the_experiment(tmp_path):
    pytest.importorskip("mlflow")
    from app.config import ConfigError
    from app.engine.start_checks import check_trackers

    db = tmp_path / "mlflow.db"
    cfg = config(
        with_trackers(
            tmp_path,
            "tracking.wandb.enabled=false",
            f"tracking.mlflow.tracking_uri=sqlite:///{db}",
            "tracking.mlflow.artifact_location=bogus://zz",
        )
    )
    with pytest.raises(
        ConfigError, match=r"^tracking.mlflow.artifact_location='bogus://zz': .*bogus"
    ):
        check_trackers(cfg.tracking)
    assert not db.exists()  # no experiment was created with it
    cfg.tracking.mlflow.artifact_location = str(tmp_path / "artifacts")
    check_trackers(cfg.tracking)  # a local directory is fine


def test_an_unreachable_mlflow_server_is_one_line_within_seconds(tmp_path, monkeypatch):
    """MLflow's own defaults retry a refused connection for minutes (SIGTERM waits too): the
    client is made with the short limits in force."""
    pytest.importorskip("mlflow")
    import os

    import mlflow.tracking

    from app.components.tracking.mlflow_sink import HTTP_LIMITS
    from app.components.tracking.sinks import build_sinks
    from app.config import ConfigError

    for name in HTTP_LIMITS:
        monkeypatch.delenv(name, raising=False)
    cfg = config(
        with_trackers(
            tmp_path,
            "tracking.wandb.enabled=false",
            "tracking.mlflow.tracking_uri=http://127.0.0.1:9",  # the discard port: refused
        )
    )
    seen: list[dict[str, str | None]] = []
    real_client = mlflow.tracking.MlflowClient

    def client(*args, **kwargs):
        seen.append({name: os.environ.get(name) for name in HTTP_LIMITS})
        return real_client(*args, **kwargs)

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", client)  # imported at the start
    try:
        with pytest.raises(ConfigError, match=r"^tracking\.mlflow: could not start: "):
            build_sinks(cfg.tracking, tmp_path / "run", None)
    finally:
        for name in HTTP_LIMITS:
            os.environ.pop(name, None)
    assert seen == [HTTP_LIMITS]  # MLflow's defaults would retry for about 4.5 minutes


def test_each_tracker_starts_from_its_own_typed_settings(tmp_path):
    """A tracker declares its settings' class; it is handed that node, typed, and a node of
    another type is refused rather than read with getattr."""
    from app.components.tracking import TRACKERS, Tracker
    from app.components.tracking.config import TrackingConfig
    from app.components.tracking.mlflow_sink import MlflowConfig
    from app.components.tracking.wandb_sink import WandbConfig

    tracking = TrackingConfig()
    assert {t.name: t.settings for t in TRACKERS.all()} == {
        "mlflow": MlflowConfig,
        "wandb": WandbConfig,
    }
    seen = []
    probe = Tracker("wandb", "wandb", "wandb", MlflowConfig, start=lambda s, *a: seen.append(s))
    with pytest.raises(TypeError, match=r"tracking\.wandb is WandbConfig"):
        probe.start_in(tracking, tmp_path, "run", None)
    assert TRACKERS.get("mlflow").settings_in(tracking) is tracking.mlflow and not seen
