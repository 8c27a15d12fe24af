"""A throwaway PostgreSQL cluster for the store's tests: Debian's initdb and pg_ctl (``postgresql``, which .ci/run
installs), listening only on a unix socket in a fresh folder, stopped and removed afterwards. Root cannot run a
cluster, so as root it runs as the ``postgres`` user the package creates."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["find_bin", "throwaway_cluster"]

START_BOUND = 60  # seconds pg_ctl waits for the server to accept connections (-t)
STOP_BOUND = 30


def find_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin holding initdb and pg_ctl; None without one."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin")
             if (p / "initdb").is_file() and (p / "pg_ctl").is_file()]
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0) if found else None


def _as_owner() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError("running as root and there is no postgres user to run the cluster as") from None
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


@contextmanager
def throwaway_cluster(bin_dir: Path) -> Iterator[str]:
    """A running cluster; yields the psycopg URL of its ``postgres`` database over the unix socket."""
    owner = _as_owner()
    # not under pytest's tmp_path: a unix socket path has ~107 bytes, and root's tmp_path is closed to postgres
    root = Path(tempfile.mkdtemp(prefix="kvpg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if owner:
        for path in (root, sock):
            shutil.chown(path, user="postgres", group="postgres")
    run = dict(capture_output=True, text=True, stdin=subprocess.DEVNULL, **owner)
    try:
        subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync",
                        "-E", "UTF8"], check=True, timeout=120, **run)
        options = f"-k {sock} -c listen_addresses='' -c fsync=off"
        subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w",
                        "-t", str(START_BOUND), "start"], check=True, timeout=START_BOUND + 30, **run)
        try:
            yield f"postgresql://postgres@/postgres?host={sock}"
        finally:
            subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t",
                            str(STOP_BOUND), "stop"], timeout=STOP_BOUND + 30, **run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
