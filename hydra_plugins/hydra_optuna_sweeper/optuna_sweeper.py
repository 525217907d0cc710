"""The stock hydra-optuna-sweeper's class path, answered by this project's sweeper.

Configs written for the stock plugin often name its class, as widely used templates do:
`hydra.sweeper._target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper`.
Without the stock plugin that class is this subclass of ours, with the stock keys and defaults
(`hydra/sweeper=optuna`).

This directory has no `__init__.py` on purpose: it is a namespace portion, and a regular
package of the same name anywhere on the path (the installed stock plugin) wins over it, so
with the stock plugin installed this file is never imported and the stock plugin runs. Hydra's
plugin scan does not enter namespace portions;
`hydra_plugins/hydratrain_optuna_sweeper/stock_class_path.py` imports this module so that the
scan registers the class under this module's name.
"""

from __future__ import annotations

from pathlib import Path

from hydra_plugins.hydratrain_optuna_sweeper import optuna_sweeper as _ours

if Path(__file__).with_name("__init__.py").exists():
    # Only a non-editable install of hydratrain over the stock plugin's files puts this module
    # into the stock's package, replacing the stock's own: refuse rather than run in its place.
    raise ImportError(
        f"{__file__} is hydratrain's stand-in for the stock hydra-optuna-sweeper and replaced "
        "the stock plugin's own module: reinstall hydra-optuna-sweeper, and install hydratrain "
        "editable (pip install -e) beside it"
    )


class OptunaSweeper(_ours.OptunaSweeper):
    """`hydra/sweeper=optuna`'s sweeper (stock keys and defaults) under the stock class path."""
