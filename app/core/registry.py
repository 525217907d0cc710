"""Components of one kind, found by name: the modules of a package that register themselves.

Each component module (an optimizer, a task, a model family, a data source, a tracker) adds
itself to its kind's registry when imported; the first lookup imports every public module of
the package. Adding a component is adding a module: no table elsewhere lists the names.
Component modules are imported while a config is validated, so they keep torch and transformers
out of their top-level imports (`--cfg job` answers without loading either).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

from app.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, package: str, setting: str, private: bool = False) -> None:
        self.package = package
        self.setting = setting  # the setting that names one, for error lines
        # private: the package's `_name` modules are the components (a Hydra plugin's room,
        # whose public modules Hydra's plugin scan would import at every start)
        self.private = private
        self._items: dict[str, T] = {}
        self._loaded = False

    def add(self, item: T) -> T:
        """Register `item` under its `name`; usable as a class decorator."""
        name = _name(item)
        if name in self._items and self._items[name] is not item:
            raise ValueError(f"{self.setting}: two components named {name!r}")
        self._items[name] = item
        return item

    def remove(self, name: str) -> None:
        """Forget `name` (a component a test added for its own run)."""
        self._items.pop(name, None)

    def get(self, name: str) -> T:
        self._load()
        if name not in self._items:
            raise ConfigError(
                f"{self.setting}={name!r} is not allowed; choose one of: {', '.join(self.names())}"
            )
        return self._items[name]

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(sorted(self._items))

    def all(self) -> list[T]:
        return [self._items[n] for n in self.names()]

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            if _is_private(module.name) == self.private:
                importlib.import_module(f"{self.package}.{module.name}")


def _is_private(module: str) -> bool:
    return module.startswith("_") and not module.startswith("__")


def _name(item: object) -> str:
    """A component's `name`: a class attribute of the classes registered, a field of the rest."""
    name = getattr(item, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"{item!r} has no name to register it under")
    return name
