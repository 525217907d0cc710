"""Puts the repository's sweeps/ on Hydra's search path, so `+sweeps=NAME` selects a study.

`_searchpath/sweeps` is a symlink to the repository's sweeps/ directory: adding its parent
makes `sweeps` the only config group this plugin contributes (adding the repository root would
list every directory holding YAML as a group).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

SEARCH_DIR = Path(__file__).resolve().parent / "_searchpath"


class HydratrainSweepsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if (SEARCH_DIR / "sweeps").is_dir():  # a source checkout: the symlink resolves
            search_path.append(provider="hydratrain-sweeps", path=f"file://{SEARCH_DIR}")
