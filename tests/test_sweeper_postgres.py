"""The sweeper on a real PostgreSQL server (tests/pg_server.py starts one; skipped without the
binaries): the command of docs/scaling.md as written, a database restart in the middle of a
trial, and a password in the storage URL that appears in nothing the sweep prints or writes."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.hydratrain_optuna_sweeper._study._storage import STORAGE_ENV, with_driver
from tests import pg_server, procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
FAKE = [*procs.FAKE, "-m", "hpo=optuna"]
# The real trainer, tiny and quick: a few seconds per trial.
TINY = [
    "gpu=cpu",
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "data.seq_len=32",
    "data.builtin_num_docs=200",
    "training.max_steps=4",
    "training.eval_every=2",
    "training.eval_samples=8",
    "training.micro_batch_size=4",
    "training.progress_bar=false",
    "hydra.sweeper.params={training.effective_batch_size:'choice(4, 8)'}",
]
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def pg():
    server, why = pg_server.start()
    if server is None:
        pytest.skip(why)
    yield server
    pg_server.stop(server)


def _trials(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(with_driver(url, "test"))
    return optuna.load_study(study_name=study, storage=storage).get_trials()


def test_the_readme_command_works_as_written(pg, tmp_path):
    """`hpo.storage=postgresql://USER:PASS@HOST/optuna` with the `postgres` extra installed."""
    proc = procs.train(
        "-m",
        "hpo=optuna",
        f"hpo.storage={pg.url}",
        "hpo.study_name=readme",
        "hpo.n_trials=2",
        *TINY,
        f"data.cache_dir={tmp_path}/cache",
        f"hydra.sweep.dir={tmp_path}/multirun",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    states = [t.state for t in _trials(pg.url, "readme")]
    # Both trials ran to an end through the database; the second may be pruned by the default
    # pruner (successive halving keeps only the best so far while a rung has few trials).
    assert len(states) == 2 and states[0] == TrialState.COMPLETE
    assert states[1] in (TrialState.COMPLETE, TrialState.PRUNED)


def _fake(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    cmd = [*FAKE, "hpo.tensorboard=false", *args]
    return procs.start(cmd, env=procs.environment(out=tmp_path, **(env or {})))


def test_a_database_restart_mid_trial_does_not_fail_the_trial(pg, tmp_path):
    """Calls while the server is down are retried (for up to a minute), and a connection the
    restart closed is replaced; else Optuna fails the trial, saying "invalid data in the
    commit" whatever the cause."""
    proc = _fake(
        tmp_path,
        f"hpo.storage={pg.url}",
        "hpo.study_name=restart",
        "hpo.n_trials=3",
        "hpo.pruner=none",
        "hpo.heartbeat_interval=0.3",
        "fake.step_sleep=0.4",  # 5 evaluations: 2 s a trial
    )

    def restart_during_the_first_trial() -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.2)
            try:
                trials = _trials(pg.url, "restart")
            except Exception:  # the study does not exist yet
                continue
            if trials and trials[0].intermediate_values:
                pg.restart(down_for=1.5)  # evaluations report while it is down
                return

    if pg.data is None:
        pytest.skip("an existing server (HYDRATRAIN_TEST_POSTGRES_URL) is not ours to restart")
    restarter = threading.Thread(target=restart_during_the_first_trial)
    restarter.start()
    out, err = proc.communicate(timeout=180)
    restarter.join()
    assert proc.returncode == 0, err[-3000:]
    assert "invalid data in the commit" not in out + err
    assert [t.state for t in _trials(pg.url, "restart")] == [TrialState.COMPLETE] * 3


def _everything_under(root: Path) -> bytes:
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("how", ["command line", "environment"])
def test_no_password_in_anything_a_sweep_prints_or_writes(how, pg, tmp_path):
    given = (
        f"hpo.storage={pg.url}" if how == "command line" else "hpo.storage=${oc.env:OPTUNA_STORAGE}"
    )
    study = f"secret_{how.replace(' ', '_')}"
    proc = procs.train(
        "-m",
        "hpo=optuna",
        given,
        f"hpo.study_name={study}",
        "hpo.n_trials=2",
        *TINY,
        f"data.cache_dir={tmp_path}/cache",
        f"hydra.sweep.dir={tmp_path}/multirun",
        env={"OPTUNA_STORAGE": pg.url},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(_trials(pg.url, study)) == 2  # the storage was reached
    secret = pg_server.PASSWORD.encode()
    assert secret not in (proc.stdout + proc.stderr).encode()
    sweep = tmp_path / "multirun"
    for name in ("multirun.yaml", "optimization_results.yaml", "0/.hydra/hydra.yaml"):
        assert (sweep / name).is_file()  # among what is read below
    assert secret not in _everything_under(sweep), "a file of the sweep holds the password"
    job_cfg = (sweep / "0" / ".hydra" / "config.yaml").read_text()
    assert "storage: ${oc.env:" + STORAGE_ENV + "}" in job_cfg  # the variable, not the URL
