"""Where a study lives: the storage setting resolved, opened, and its password kept out of sight.

A storage is in memory (the stock sweeper's `storage: null`), an Optuna journal file (a path;
safe for several processes on one machine), a database URL (an Optuna RDB storage; workers on
many machines), or an object a config builds (`_target_: optuna.storages.RDBStorage`).

Secrets. A password in a storage URL is masked (`***`) in every line this sweeper prints or
writes. Jobs get `hpo.storage=${oc.env:HYDRATRAIN_HPO_STORAGE}` instead of the URL, with the URL
in that variable of this process (inherited by launcher processes), so Hydra's `.hydra/` files
of every trial hold only the variable's name.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote

from omegaconf import DictConfig, OmegaConf

from app.core.redact import MASK, URL_PASSWORD, mask_url_passwords

from .._errors import StorageUnreachable, SweepConfigError, first_line

if TYPE_CHECKING:
    from optuna.storages import BaseStorage, JournalStorage

STORAGE_ENV = "HYDRATRAIN_HPO_STORAGE"
JOURNAL_NAME = "study.journal"
MEMORY = "memory"  # what jobs get as hpo.storage for a study only this process can reach
# scheme://user:PASSWORD@host...: the password is what lies between the first ':' after the
# user and the '@' before the host.
# SQLAlchemy's defaults: 1.4/2.0 psycopg2, 2.1 psycopg (3). Use what is installed.
_PG_DRIVERS = (("psycopg", "psycopg"), ("psycopg2", "psycopg2"))
RETRY_SECONDS = 60.0  # how long a database restart may take before a trial gives up on it


def passwords(text: str) -> set[str]:
    """The passwords of the URLs in `text`, as written and percent-decoded."""
    found = {m.group("password") for m in URL_PASSWORD.finditer(text)}
    return found | {unquote(p) for p in found}


@dataclass(frozen=True)
class Masker:
    """Replaces known secrets, and the password of any URL, with ***."""

    secrets: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, texts: Iterable[str]) -> Masker:
        found: set[str] = set()
        for text in texts:
            found |= passwords(text)
        return cls(frozenset(s for s in found if s))

    def __call__(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return mask_url_passwords(text)


@dataclass(frozen=True)
class StorageSpec:
    kind: str  # memory | journal | url | object
    target: str | DictConfig | None  # the journal's absolute path, the URL, the object's node
    key: str  # the setting that named it, for error lines

    @property
    def text(self) -> str:
        if self.kind == "object":
            return OmegaConf.to_yaml(self.target, resolve=True).strip().replace("\n", ", ")
        return MEMORY if self.kind == MEMORY else str(self.target)

    @property
    def persistent(self) -> bool:
        return self.kind != MEMORY

    @property
    def lock_path(self) -> str | None:
        """A file lock makes asks atomic among processes sharing a journal file."""
        return f"{self.target}.budget.lock" if self.kind == "journal" else None

    @property
    def reachable_by_jobs(self) -> bool:
        """A job in another process can open it from its text."""
        return self.kind in ("journal", "url")


def storage_spec(value: object, key: str, sweep_dir: str, null_is_memory: bool) -> StorageSpec:
    """The setting as given -> what it names. A relative path is taken from the launch dir."""
    if isinstance(value, DictConfig | dict):
        if "_target_" not in value:
            raise SweepConfigError(f"{key} is a mapping without _target_; give a URL or a path")
        return StorageSpec("object", OmegaConf.create(value), key)
    if value is None or str(value) == "":
        if null_is_memory:
            return StorageSpec(MEMORY, None, key)
        return StorageSpec("journal", str(Path(sweep_dir, JOURNAL_NAME).absolute()), key)
    text = str(value)
    if text == MEMORY:
        return StorageSpec(MEMORY, None, key)
    if "://" in text:
        return StorageSpec("url", text, key)
    return StorageSpec("journal", str(Path(text).absolute()), key)


def open_storage(spec: StorageSpec, mask: Masker) -> BaseStorage:
    """An Optuna storage; one that cannot be opened fails naming the setting (password masked)."""
    import optuna

    try:
        if spec.kind == MEMORY:
            return optuna.storages.InMemoryStorage()
        if spec.kind == "url":
            # pool_pre_ping: after a database restart, a dead pooled connection is replaced
            # instead of failing the next call ("invalid data in the commit").
            url = with_driver(str(spec.target), spec.key)
            return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
        if spec.kind == "object":
            from hydra.utils import instantiate

            return instantiate(spec.target)
        Path(str(spec.target)).parent.mkdir(parents=True, exist_ok=True)
        return journal(str(spec.target))
    except SweepConfigError:
        raise
    except Exception as e:
        raise SweepConfigError(
            mask(f"{spec.key}={spec.text!r} cannot be opened: {first_line(e)}")
        ) from None


def journal(path: str) -> JournalStorage:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    # The open-lock works on local disks and NFS alike.
    return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


def with_driver(url: str, key: str) -> str:
    """postgresql://... with the driver that is installed (psycopg 3, else psycopg2)."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    for module, driver in _PG_DRIVERS:
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}{sep}{rest}"
    raise SweepConfigError(
        f"{key}: a PostgreSQL storage needs a driver: pip install 'psycopg[binary]' "
        "(or the project's extra: pip install -e '.[postgres]')"
    )


def job_storage(spec: StorageSpec, mask: Masker) -> str:
    """hpo.storage as jobs get it: a secret stays in this process's environment."""
    if not spec.reachable_by_jobs:
        return MEMORY
    if mask(spec.text) == spec.text:
        return spec.text
    os.environ[STORAGE_ENV] = spec.text
    return "${oc.env:" + STORAGE_ENV + "}"


T = TypeVar("T")


def retrying(call: Callable[[], T], what: str, seconds: float = RETRY_SECONDS) -> T:
    """`call()`, again while the database is unreachable (a restart), for up to `seconds`."""
    deadline = time.monotonic() + seconds
    delay = 0.5
    while True:
        try:
            return call()
        except Exception as e:
            if not is_disconnect(e):
                raise
            if time.monotonic() > deadline:
                raise StorageUnreachable(
                    f"the study's database did not answer for {seconds:.0f}s ({what}): "
                    f"{first_line(e)}"
                ) from None
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


def is_disconnect(exc: BaseException) -> bool:
    """A lost or refused database connection, however Optuna wrapped it (its
    StorageInternalError says "invalid data in the commit" whatever the cause)."""
    try:
        from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
    except ImportError:  # pragma: no cover - Optuna installs SQLAlchemy
        return False
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OperationalError | InterfaceError | DisconnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
