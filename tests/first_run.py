"""Every test session is a first run on a brand-new machine.

A library builds some things once per home and may start a program to do it: matplotlib lists
the system's fonts the first time it draws text (it runs `fc-list`), the standard library asks
`uname -p` for the first `platform.processor()`, inductor compiles kernels with the C compiler
and keeps them. On a machine that ran the suite before, the result sits in `~/.cache` (or
`/tmp/torchinductor_$USER`) and nothing is started; on a new one the first test that draws or
compiles starts the program, and the tiers' rule (tests/tiers.py) fails it. A warm machine,
CI's included, hides that.

So the session points every such cache at a directory of its own, made empty when the session
starts (`fresh_caches`): each session is a first run, wherever it runs, and the user's own caches
are neither read nor written by the tests. Then `build_once_per_home` builds here, before the
tiers' rule is armed for any test, what a library builds by starting a program. A new library
that does the same fails the fast tiers on every machine until it is added there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Set by the session's first process (pytest itself): xdist's workers and the programs the e2e
# tests start inherit it and share the session's caches instead of making their own.
SESSION_CACHES = "HYDRATRAIN_TEST_CACHES"


def fresh_caches() -> Path:
    """Point the per-home caches at this session's own empty directory (made once, by the first
    process of the session, removed when it exits). Before anything imports the libraries:
    matplotlib and Hugging Face read these variables at import."""
    root = os.environ.get(SESSION_CACHES)
    if root is None:
        root = tempfile.mkdtemp(prefix="hydratrain-test-caches-")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        os.environ[SESSION_CACHES] = root
    home = Path(root)
    for variable, path in cache_locations(home).items():
        os.environ[variable] = str(path)
    return home


def cache_locations(home: Path) -> dict[str, Path]:
    """Each library's variable for what it keeps per home, inside `home`."""
    return {
        "XDG_CACHE_HOME": home / "cache",  # fontconfig, torch hub, the default of those below
        "XDG_CONFIG_HOME": home / "config",
        "MPLCONFIGDIR": home / "matplotlib",
        "HF_HOME": home / "huggingface",  # hub, datasets and transformers caches
        "TORCHINDUCTOR_CACHE_DIR": home / "torchinductor",
        "TRITON_CACHE_DIR": home / "triton",
        # This project's own: token data, trained tokenizers, the micro-batch plans (by default
        # under the checkout, where an earlier session's plan would answer without a probe).
        "HYDRATRAIN_CACHE": home / "hydratrain",
    }


def build_once_per_home() -> None:
    """What a library builds on its first use in a home by starting a program, done once here."""
    import platform

    # `uname -p`, at the first call (mlflow and wandb ask at import).
    platform.processor()

    import matplotlib

    matplotlib.use("Agg")
    # The font list: `fc-list` at the first import of the font manager in an empty cache. Every
    # later process of the session (xdist's workers included) reads the list from the cache.
    import matplotlib.font_manager
