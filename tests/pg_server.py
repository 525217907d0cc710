"""A throwaway PostgreSQL server for the sweeper's database tests.

Started from the PostgreSQL binaries on this machine (Debian's `postgresql` package puts them
in /usr/lib/postgresql/<version>/bin) in a temporary directory, on a free port, with password
authentication over TCP; as the `postgres` user when the tests run as root (the server refuses
root). `HYDRATRAIN_TEST_POSTGRES_URL` names an existing server instead (then nothing is
restarted). Without either, the tests using it skip.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

USER = "hydra"
PASSWORD = "pw-7f3a9c-SECRET"  # distinctive, so a leak is found by grep
DATABASE = "optuna"


@dataclass
class PgServer:
    url: str  # postgresql://USER:PASSWORD@127.0.0.1:PORT/optuna
    data: Path | None = None  # None: an existing server, not ours to restart
    bindir: Path | None = None
    run_as: tuple[str, ...] = ()

    def pg_ctl(self, *args: str) -> None:
        assert self.data is not None and self.bindir is not None
        cmd = [*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", *args]
        # The server writes to the log file, never to our pipes (it outlives this call).
        log = ["-l", str(self.data.parent / "log")] if args[-1] in ("start", "restart") else []
        subprocess.run([*cmd[:-1], *log, cmd[-1]], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)  # fmt: skip

    def restart(self, down_for: float = 0.0) -> None:
        """Stop (closing every connection), stay down `down_for` seconds, start again."""
        self.pg_ctl("-m", "fast", "stop")
        time.sleep(down_for)
        self.pg_ctl("start")


def _bindir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> tuple[PgServer | None, str]:
    """(server, "") or (None, why not)."""
    if os.environ.get("HYDRATRAIN_TEST_POSTGRES_URL"):
        return PgServer(os.environ["HYDRATRAIN_TEST_POSTGRES_URL"]), ""
    bindir = _bindir()
    if bindir is None:
        return None, "no PostgreSQL server binaries (Debian package postgresql)"
    run_as: tuple[str, ...] = ()
    base = Path(tempfile.mkdtemp(prefix="hydratrain-pg-"))
    if os.geteuid() == 0:  # the server refuses to run as root
        if shutil.which("runuser") is None:
            return None, "running as root without runuser"
        shutil.chown(base, "postgres")
        run_as = ("runuser", "-u", "postgres", "--")
    try:
        return _init(bindir, base, run_as), ""
    except (subprocess.SubprocessError, OSError, LookupError) as e:
        shutil.rmtree(base, ignore_errors=True)
        return None, f"could not start PostgreSQL: {e}"


def _init(bindir: Path, base: Path, run_as: tuple[str, ...]) -> PgServer:
    pwfile = base / "pw"
    pwfile.write_text(PASSWORD)
    if run_as:
        shutil.chown(pwfile, "postgres")
    data, port = base / "data", _free_port()

    def run(*cmd: str) -> None:
        subprocess.run([*run_as, *cmd], check=True, capture_output=True, timeout=120)

    run(str(bindir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={pwfile}",
        "--auth-host=scram-sha-256", "--auth-local=trust", "--no-sync")  # fmt: skip
    with (data / "postgresql.conf").open("a") as conf:  # read by every start
        conf.write(f"port = {port}\nunix_socket_directories = '{base}'\n")
        conf.write("listen_addresses = '127.0.0.1'\nfsync = off\n")
    server = PgServer(
        url=f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/{DATABASE}",
        data=data,
        bindir=bindir,
        run_as=run_as,
    )
    server.pg_ctl("start")
    run(str(bindir / "psql"), "-h", str(base), "-p", str(port), "-U", USER, "-d", "postgres",
        "-c", f"CREATE DATABASE {DATABASE}")  # fmt: skip
    return server


def stop(server: PgServer) -> None:
    if server.data is None:
        return
    try:
        server.pg_ctl("-m", "immediate", "stop")
    finally:
        shutil.rmtree(server.data.parent, ignore_errors=True)
