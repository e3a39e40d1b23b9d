"""A private PostgreSQL server for the tests: Debian's initdb and pg_ctl, run as the postgres user, in a temporary
folder, on 127.0.0.1 and a free port. Standard library only, so `.ci/run` can start one before any virtual
environment exists (`python3 tests/postgres_support.py start DIR` prints its URL; `stop DIR` stops it).

The tests take the server named by INVOKEAI_TEST_POSTGRES_URL when it is set (`.ci/run` sets it), and start their own
otherwise. INVOKEAI_TEST_POSTGRES_REQUIRED=1 turns "no PostgreSQL here" from a skip into a failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

URL_ENV = "INVOKEAI_TEST_POSTGRES_URL"
REQUIRED_ENV = "INVOKEAI_TEST_POSTGRES_REQUIRED"
_PORT_FILE = "port"
_OPTIONS_FILE = "options"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries on this machine, or the server would not start: says which and why."""


def find_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/<major>/bin that has initdb and pg_ctl."""

    def major(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major, reverse=True):
        if (Path(found) / "initdb").exists() and (Path(found) / "pg_ctl").exists():
            return Path(found)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    # PostgreSQL refuses to run as root; as any other user it runs as that user.
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + args, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def start(folder: Path) -> str:
    """initdb into `folder`/data and start the server; returns its URL (database `postgres`, user `postgres`)."""
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable(
            "no PostgreSQL binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin: apt-get install postgresql"
        )
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    data = folder / "data"
    done = _as_postgres(
        [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-N"],
        folder,
        120,
    )
    if done.returncode != 0:
        raise PostgresUnavailable(f"initdb failed: {(done.stderr or done.stdout)[-400:]}")
    port = _free_port()
    # Durability is not what the tests measure: without fsync a test database costs no disk flushes.
    options = (
        f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off -c synchronous_commit=off -c full_page_writes=off "
        "-c max_connections=300"
    )
    (folder / _OPTIONS_FILE).write_text(options)
    _pg_ctl_start(bindir, folder)
    (folder / _PORT_FILE).write_text(str(port))
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _pg_ctl_start(bindir: Path, folder: Path) -> None:
    log = folder / "server.log"
    options = (folder / _OPTIONS_FILE).read_text()
    command = [str(bindir / "pg_ctl"), "-D", str(folder / "data"), "-l", str(log), "-w", "-o", options, "start"]
    done = _as_postgres(command, folder, 90)
    if done.returncode != 0:
        text = log.read_text(errors="replace") if log.exists() else ""
        raise PostgresUnavailable(f"pg_ctl start failed: {(done.stderr or done.stdout)[-300:]} {text[-300:]}")


def halt(folder: Path) -> None:
    """Stop the server started in `folder` as an operator's restart does (fast: every session is terminated, and
    clients get "terminating connection due to administrator command"), keeping its data for `resume`."""
    bindir = find_bindir()
    assert bindir is not None
    command = [str(bindir / "pg_ctl"), "-D", str(folder / "data"), "-m", "fast", "-w", "-t", "30", "stop"]
    done = _as_postgres(command, folder, 60)
    if done.returncode != 0:
        raise PostgresUnavailable(f"pg_ctl stop failed: {(done.stderr or done.stdout)[-300:]}")


def resume(folder: Path) -> None:
    """Start again, on the same port and data, a server that `halt` stopped."""
    bindir = find_bindir()
    assert bindir is not None
    _pg_ctl_start(bindir, folder)


def is_running(folder: Path) -> bool:
    return (folder / "data" / "postmaster.pid").exists()


def stop(folder: Path) -> None:
    """Stop the server started in `folder` (immediately: the tests' data is thrown away) and delete the folder."""
    bindir = find_bindir()
    data = folder / "data"
    if bindir is not None and (data / "postmaster.pid").exists():
        try:
            command = [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"]
            _as_postgres(command, folder, 60)
        except subprocess.TimeoutExpired:
            pass
    shutil.rmtree(folder, ignore_errors=True)


class PrivatePostgres:
    """One server for a test session: started on entry (or the one INVOKEAI_TEST_POSTGRES_URL names), stopped on
    exit."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.url = os.environ.get(URL_ENV, "")

    def __enter__(self) -> PrivatePostgres:
        if not self.url:
            self.folder = Path(tempfile.mkdtemp(prefix="invokeai-test-pg-"))
            try:
                self.url = start(self.folder)
            except BaseException:
                stop(self.folder)
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            stop(self.folder)

    def database_url(self, name: str) -> str:
        """The URL of database `name` on this server (the same user, host and port)."""
        return self.url.rsplit("/", 1)[0] + "/" + name


class FaultyPostgres:
    """A server of a test session's own, never the shared one INVOKEAI_TEST_POSTGRES_URL names, for tests that stop
    and restart it (a database outage, an operator's restart)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="invokeai-test-pg-faults-"))
        try:
            self.url = start(self.folder)
        except BaseException:
            stop(self.folder)
            raise

    def database_url(self, name: str) -> str:
        return self.url.rsplit("/", 1)[0] + "/" + name

    def restart(self) -> None:
        """`pg_ctl restart` as an operator runs it: every open connection is terminated."""
        halt(self.folder)
        resume(self.folder)

    def halt(self) -> None:
        halt(self.folder)

    def resume(self) -> None:
        if not is_running(self.folder):
            resume(self.folder)

    def close(self) -> None:
        stop(self.folder)


class FaultyDatabase:
    """A test's own database on the fault server, and the faults: restart, halt (the server down) and resume."""

    def __init__(self, server: FaultyPostgres, name: str) -> None:
        self.url = server.database_url(name)
        self.restart, self.halt, self.resume = server.restart, server.halt, server.resume


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: postgres_support.py start|stop FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[1])
    if argv[0] == "stop":
        stop(folder)
        return 0
    try:
        print(start(folder))
    except PostgresUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        stop(folder)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
