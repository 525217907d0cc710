"""Each test session is a first run on a new machine (tests/first_run.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.first_run import SESSION_CACHES

pytestmark = pytest.mark.unit


def _session() -> Path:
    return Path(os.environ[SESSION_CACHES]).resolve()


def _inside(path: str | Path, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def test_every_library_keeps_its_per_home_cache_in_the_session_s_own_directory():
    """Not in the user's home, where an earlier run's font list or kernels hide a first run."""
    import datasets.config
    import huggingface_hub.constants
    import matplotlib
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from tests.conftest import config

    root = _session()
    places = {
        "matplotlib cache": matplotlib.get_cachedir(),
        "matplotlib config": matplotlib.get_configdir(),
        "Hugging Face hub": huggingface_hub.constants.HF_HUB_CACHE,
        "datasets": datasets.config.HF_DATASETS_CACHE,
        "inductor": cache_dir(),
        "token data and micro-batch plans": config(["gpu=cpu"]).data.cache_dir,
    }
    outside = {name: path for name, path in places.items() if not _inside(path, root)}
    assert not outside, f"outside the session's caches {root}: {outside}"


def test_drawing_text_starts_no_program(tmp_path):
    """The font list matplotlib builds on first use (by running fc-list) was built before the
    tiers' rule was armed: text is drawn here, in the fast tier, with no program started."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title("validation loss")
    ax.plot([1, 2, 3], [3.0, 2.0, 1.5], label="batch 32")
    ax.legend()
    fig.savefig(tmp_path / "plot.png")
    plt.close(fig)
    assert (tmp_path / "plot.png").stat().st_size > 0
