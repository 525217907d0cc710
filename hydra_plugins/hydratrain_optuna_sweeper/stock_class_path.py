"""Registers the stock plugin's class path with Hydra when the stock plugin is not installed.

Hydra's plugin scan (hydra.core.plugins) walks the `hydra_plugins` namespace with
`pkgutil.walk_packages`, which lists only directories holding an `__init__.py`: it never sees
`hydra_plugins/hydra_optuna_sweeper/optuna_sweeper.py`, a namespace portion. It registers every
concrete plugin class it finds among a scanned module's members under that class's own module
and name, so the class imported here is registered as
`hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper`. With the stock plugin
installed, nothing is imported here: the stock's package is scanned and its class registered.
"""

from __future__ import annotations

import importlib

from .config import STOCK_PACKAGE, stock_plugin_installed

if not stock_plugin_installed():
    # By name: this package is checked (mypy) as a top-level package, and the stand-in imports
    # it as hydra_plugins.hydratrain_optuna_sweeper, which would be the same files twice.
    OptunaSweeper = importlib.import_module(f"{STOCK_PACKAGE}.optuna_sweeper").OptunaSweeper
