"""A private PostgreSQL server for the fault suite: the suite stops and restarts it, so it
is never the shared one.

``initdb`` and ``pg_ctl`` come from ``/usr/lib/postgresql/*/bin`` (or ``PATH``); the
cluster lives in a temporary directory, listens on a free port of 127.0.0.1 with trust
authentication, and is removed by :meth:`PrivateServer.destroy`.  initdb refuses to run
as root: as root, the cluster belongs to the ``postgres`` OS user and every command runs
through ``runuser -u postgres --`` (``su postgres -c`` where runuser is missing).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class ServerUnavailable(Exception):
    """No private server can be started here; the message says why."""


def _bin_dir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for candidate in candidates:
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return Path(initdb).parent
    raise ServerUnavailable("no initdb/pg_ctl in /usr/lib/postgresql/*/bin or on PATH (install the PostgreSQL server)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateServer:
    """A throwaway PostgreSQL cluster: ``start()``, ``stop()``, ``start()`` again, ``destroy()``."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.as_user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable("running as root and there is no 'postgres' OS user to run initdb") from None
            self.as_user = "postgres"
        self.root = Path(tempfile.mkdtemp(prefix="fsm-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self.as_user is not None:
            entry = pwd.getpwnam(self.as_user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self.running = False
        self._initialised = False

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self.as_user is not None:
            if shutil.which("runuser"):
                command = ["runuser", "-u", self.as_user, "--", *command]
            else:
                command = ["su", self.as_user, "-c", shlex.join(command)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, cwd=self.root)
        if done.returncode != 0:
            raise ServerUnavailable(f"{argv[0]} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
        return done

    def start(self) -> None:
        if not self._initialised:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            self._initialised = True
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")
        self.running = True

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server; ``immediate`` is a crash as clients see it (recovery at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise ServerUnavailable(f"the private server did not accept connections on port {self.port}")

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(ServerUnavailable):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


__all__ = ["PrivateServer", "ServerUnavailable", "free_port"]
