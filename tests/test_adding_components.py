"""Adding a component is its module (and the config file Hydra needs) and its own test, and no
other file (docs/layout.md, "Extending"): for each kind, a new one is written into a copy of
the project, where the registry finds it as it finds the project's own (by importing the
modules of its package), and the checks that show lists of names run there with it: the
registries', the bad inputs' (the error lines and the docs table's rows), the layout's, the
docs'. A list typed out anywhere they look (a test's expected line, a docs row, a prose list)
misses the new name and fails here.

The copy lives under the test's tmp_path: nothing is written into the project, even if the test
is killed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
TREE = ("app", "hydra_plugins", "conf", "docs", "tests", "sweeps", "docker", "scripts", ".ci")
FILES = ("README.md", "pyproject.toml")

# The checks that read lists of names, run in the copy (as node ids: the whole file where all
# of it reads them).
BAD = "tests/test_bad_inputs.py::test_bad_run_input_is_one_line_and_touches_nothing"
BAD_SWEEP = "tests/test_bad_inputs.py::test_bad_sweep_input_is_one_line_and_leaves_the_study"
PRUNER_CHECKS = "tests/test_pruner_kinds.py::test_"
CHECKS = [
    "tests/test_registration.py",
    "tests/test_named_lists.py",
    "tests/test_layout_doc.py",
    "tests/test_references.py",
    "tests/test_readme.py",
    "tests/test_architecture.py",
    *(f"{BAD}[{case}]" for case in ("arch", "source", "group-option", "gpu-unknown")),
    f"{BAD}[fsdp-adafactor]",
    *(f"{BAD_SWEEP}[{case}]" for case in ("sampler", "pruner", "sweep-option")),
    "tests/test_bad_inputs.py::test_the_docs_table_lists_every_case",
    f"{PRUNER_CHECKS}an_unregistered_pruner_is_one_line_naming_the_registered_ones",
    f"{PRUNER_CHECKS}every_pruner_builds_from_its_defaults_under_either_budget",
    f"{PRUNER_CHECKS}each_pruner_is_its_own_module_and_says_how_the_sweep_treats_it",
    f"{PRUNER_CHECKS}no_code_outside_a_pruners_module_compares_its_name",
    "tests/test_optimizers.py::test_every_optimizer_keeps_no_more_state_than_it_says_and_decays_"
    "matrices_only",
    "tests/test_optimizers.py::test_the_optimizer_is_a_choice_a_sweep_can_search",
    "tests/test_warm_start.py::test_rungs_only_for_a_pruner_that_compares_reports",
]

PRUNER = {
    "hydra_plugins/hydratrain_optuna_sweeper/_pruners/_quartile.py": '''
"""`hpo.pruner=quartile`: Optuna's percentile pruner, stopping a trial in the worst quarter."""

from __future__ import annotations

import optuna

from ._kind import PRUNERS, PrunerKind


def build(args: dict[str, object], schedule: object) -> optuna.pruners.BasePruner:
    return optuna.pruners.PercentilePruner(**{"percentile": 75.0, **args})  # type: ignore[arg-type]


PRUNERS.add(PrunerKind("quartile", build=build, compares_reports=True))
''',
    "tests/test_pruner_quartile.py": """
import optuna
import pytest

from app.config.budget import ReportAxis
from hydra_plugins.hydratrain_optuna_sweeper._pruners._kind import build_pruner

pytestmark = pytest.mark.unit


def test_quartile_stops_a_trial_in_the_worst_quarter():
    args = {"n_startup_trials": 0, "n_warmup_steps": 0}
    pruner = build_pruner("quartile", args, 1, ReportAxis(every=1, last=10))
    study = optuna.create_study(pruner=pruner)
    for value in (1.0, 2.0, 3.0, 4.0):
        trial = study.ask()
        trial.report(value, 1)
        study.tell(trial, value)
    worst = study.ask()
    worst.report(10.0, 1)
    assert worst.should_prune()
""",
}

FAMILY = {
    "app/components/models/families/untied_gpt2.py": '''
"""GPT-2 with an output matrix of its own (not tied to the token embeddings), from sizes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.models.families import MODELS, ModelFamily, Sizes, causal_lm, model_vocab
from app.components.models.heads import CAUSAL_LM

if TYPE_CHECKING:
    import torch

    from app.components.data.task_data import TaskData
    from app.components.models.config import ModelConfig
    from app.components.models.families import Task


def parameters(m: ModelConfig, vocab: int) -> int:
    d, ffn = m.n_embd, m.intermediate_size or 4 * m.n_embd
    per_layer = 4 * d * d + 4 * d + 2 * d * ffn + ffn + d + 4 * d
    return 2 * vocab * d + m.max_position_embeddings * d + m.n_layer * per_layer + 2 * d


def build(m: ModelConfig, data: TaskData, task: Task) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(
        vocab_size=model_vocab(m, data.vocab_size),
        n_positions=m.max_position_embeddings,
        n_embd=m.n_embd,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_inner=m.intermediate_size,
        tie_word_embeddings=False,
    )
    return causal_lm(AutoModelForCausalLM.from_config(config), m)


MODELS.add(
    ModelFamily("untied_gpt2", build=build, shape=Sizes, heads=(CAUSAL_LM,), parameters=parameters)
)
''',
    "conf/model/untied_gpt2_tiny.yaml": """# GPT-2 with its own output matrix, small enough for CPU.
name: untied_gpt2_tiny
arch: untied_gpt2
n_layer: 2
n_head: 4
n_embd: 64
max_position_embeddings: 128
""",
    "tests/test_family_untied_gpt2.py": """
import pytest

from tests.conftest import config, lm_model

pytestmark = pytest.mark.unit


def test_its_output_matrix_is_its_own(tmp_path):
    cfg = config(["gpu=cpu", f"data.cache_dir={tmp_path}", "model=untied_gpt2_tiny"])
    model = lm_model(arch="untied_gpt2")
    assert cfg.model.arch == "untied_gpt2"
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
""",
}

TASK = {
    "app/components/tasks/smoothed_lm.py": '''
"""Causal LM whose training loss is label-smoothed (task.label_smoothing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.components.tasks import TASKS
from app.components.tasks.causal_lm import IGNORE, CausalLM

if TYPE_CHECKING:
    import torch


@TASKS.add
class SmoothedLM(CausalLM):
    name = "smoothed_lm"

    def loss_sum(
        self, model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        import torch.nn.functional as F

        smoothing = self.cfg.label_smoothing if self.cfg is not None else 0.0
        logits = model(input_ids=inputs).logits
        return F.cross_entropy(
            logits.float().flatten(0, 1),
            targets.flatten(),
            ignore_index=IGNORE,
            reduction="sum",
            label_smoothing=smoothing,
        )
''',
    "conf/task/smoothed_lm.yaml": """# Causal LM, label-smoothed.
name: smoothed_lm
label_smoothing: 0.1
""",
    "tests/test_task_smoothed_lm.py": """
import pytest
import torch

from app.components.tasks import build_task
from app.components.tasks.causal_lm import CausalLM
from app.components.tasks.config import TaskConfig
from tests.conftest import config, lm_model

pytestmark = pytest.mark.unit


def test_smoothing_raises_the_loss_of_a_confident_model(tmp_path):
    cfg = config(["gpu=cpu", f"data.cache_dir={tmp_path}", "task=smoothed_lm"])
    model = lm_model()
    ids = torch.randint(0, 64, (2, 8))
    smoothed = build_task(cfg.task).loss_sum(model, ids, ids)
    plain = CausalLM(TaskConfig()).loss_sum(model, ids, ids)
    assert cfg.task.label_smoothing == 0.1 and not torch.equal(smoothed, plain)
""",
}

OPTIMIZER = {
    "app/components/optim/sgd.py": '''
"""SGD with momentum: one buffer of state per parameter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.components.optim import OPTIMIZERS, Optimizer

if TYPE_CHECKING:
    import torch

    from app.components.optim import OptimizerSettings, ParamGroup


@dataclass
class SgdArgs:
    momentum: float = 0.9
    nesterov: bool = False


def build(groups: list[ParamGroup], t: OptimizerSettings, args: SgdArgs) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(groups, lr=t.lr, momentum=args.momentum, nesterov=args.nesterov)


OPTIMIZERS.add(Optimizer("sgd", label="SGD", build=build, state_bytes_per_param=4, args=SgdArgs))
''',
    "tests/test_optimizer_sgd.py": """
import pytest
import torch

from app.components.optim import OPTIMIZERS
from app.config import TrainingConfig
from tests.conftest import lm_model

pytestmark = pytest.mark.unit


def test_sgd_keeps_a_momentum_buffer():
    model = lm_model()
    opt = OPTIMIZERS.get("sgd").create(model, TrainingConfig(optimizer="sgd"))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert all("momentum_buffer" in opt.state[p] for p in model.parameters())
""",
}

# kind -> (its files, checks that must have run on it by name: a parametrized id)
KINDS = {
    "pruner": (
        PRUNER,
        ["every_pruner_builds_from_its_defaults_under_either_budget[schedule-quartile]"],
    ),
    "family": (FAMILY, ["a_family_counts_the_parameters_of_the_model_it_builds[untied_gpt2]"]),
    "task": (TASK, []),
    "optimizer": (OPTIMIZER, ["decays_matrices_only[sgd]"]),
}


def _copy(to: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in TREE:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, to / name, ignore=skip)
    for name in FILES:
        shutil.copy2(ROOT / name, to / name)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_new_component_is_its_files_and_every_check_passes_with_it(kind, tmp_path):
    files, ran_on_it = KINDS[kind]
    copy = tmp_path / "project"
    _copy(copy)
    assert not [p for p in files if (copy / p).exists()]  # new files, no edit of the project's
    for path, text in files.items():
        (copy / path).write_text(text.lstrip("\n"))
    own_test = next(p for p in files if p.startswith("tests/"))
    argv = [procs.PY, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    proc = procs.run(
        [*argv, "-m", "not e2e", *CHECKS, own_test],
        cwd=copy,
        env=procs.environment(path=(copy,)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"PASSED {own_test}::" in proc.stdout  # found where the project finds its own
    for check in ran_on_it:
        assert check in proc.stdout, f"{check} did not run on the new {kind}"
