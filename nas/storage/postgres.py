"""A throw-away PostgreSQL server on this machine, for tests and for a user without one.

A study shared by workers on several machines needs a database server (SQLite files are
for one machine). `Postgres(folder)` runs one with its own data directory, numbered:

    1. binaries  the `pgserver` package's (the `postgres` extra ships them), else the
                 system's (`/usr/lib/postgresql/<version>/bin`, `pg_ctl` on the PATH), or
                 the folder in `NAS_POSTGRES_BIN`;
    2. account   PostgreSQL refuses to run as root: as root it runs as the `postgres`
                 account (else `nobody`), which then owns the data directory;
    3. init      once: `initdb` in `<folder>/data`, one superuser `nas` whose password
                 (generated, or given) is kept in `<folder>/server.json` with the port, so
                 a server started again on the folder has the same URL and the same studies;
    4. start     `pg_ctl start` listening on `host:port` (TCP only, loopback by default);
    5. stop      `pg_ctl stop -m fast` (a clean shutdown, as an administrator's restart).

`url` is what `study.storage=` takes. As a context manager it starts and stops the server;
`stop()` and `start()` also work in between (the fault tests stop it mid-study). The
command line is `python -m nas.storage.server postgres` (`nas.storage.server`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["BIN_ENV", "Postgres", "PostgresError", "find_binaries"]

BIN_ENV = "NAS_POSTGRES_BIN"
USER = "nas"
DATABASE = "postgres"
START_S = 60  # pg_ctl's wait for the server to start or stop
_TOOLS = ("initdb", "pg_ctl", "postgres")


class PostgresError(RuntimeError):
    """The server could not be found, initialised, started or stopped (why, and where)."""


@dataclass(frozen=True)
class _Record:
    """What `<folder>/server.json` keeps between starts."""

    host: str
    port: int
    user: str
    password: str


def find_binaries() -> Path:
    """The folder of `initdb`, `pg_ctl` and `postgres` (module docstring, 1.); PostgresError
    listing where it looked when none has them."""
    candidates: list[Path] = []
    if os.environ.get(BIN_ENV):
        candidates.append(Path(os.environ[BIN_ENV]))
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(versions)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for folder in candidates:
        if all(os.access(folder / tool, os.X_OK) for tool in _TOOLS):
            return folder
    looked = ", ".join(str(c) for c in candidates) or "nowhere"
    raise PostgresError(
        f"no PostgreSQL server binaries (initdb, pg_ctl, postgres) found (looked in: {looked}); "
        f"pip install 'elastic-nas[postgres]' (pgserver ships them), install the system's "
        f"PostgreSQL server, or set {BIN_ENV} to their folder"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the server takes it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class Postgres:
    """A PostgreSQL server whose data lives in `folder` (module docstring).

    `port` None: the one recorded in the folder, else a free one. `password` None: the
    recorded one, else a generated one. `durable=False` turns off fsync (tests: faster,
    and a crash of the machine may lose the data); it is fixed when the folder is made.
    """

    def __init__(
        self,
        folder: Path | str,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        password: str | None = None,
        durable: bool = True,
    ) -> None:
        self.folder = Path(folder).absolute()
        self.data = self.folder / "data"
        self.log = self.data / "server.log"
        self.durable = durable
        self.bin = find_binaries()
        self.account = _account()
        old = self._read_record()
        if old is not None and password is not None and password != old.password:
            raise PostgresError(
                f"{self.folder} holds a server whose password was set before; leave "
                "--password out (or use a new folder)"
            )
        self.record = _Record(
            host=host,
            port=port or (old.port if old else free_port(host)),
            user=USER,
            password=(old.password if old else password) or secrets.token_urlsafe(16),
        )

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the server's database, password included."""
        r = self.record
        return f"postgresql+psycopg2://{r.user}:{r.password}@{r.host}:{r.port}/{DATABASE}"

    @property
    def running(self) -> bool:
        done = self._run(["pg_ctl", "status", "-D", str(self.data)], check=False)
        return done.returncode == 0

    def start(self) -> Postgres:
        """Initialise the folder (once) and start the server; returns when it accepts
        connections."""
        self._prepare_folder()
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        options = f"-p {self.record.port} -h {self.record.host}"
        self._run(
            [
                *("pg_ctl", "start", "-w", "-t", str(START_S), "-D", str(self.data)),
                *("-l", str(self.log), "-o", options),
            ],
            what=f"start PostgreSQL on {self.record.host}:{self.record.port}",
        )
        self._write_record()
        return self

    def stop(self) -> None:
        """Stop the server (a fast, clean shutdown); nothing happens if it is not running."""
        if (self.data / "postmaster.pid").exists():
            self._run(
                ["pg_ctl", "stop", "-w", "-t", str(START_S), "-m", "fast", "-D", str(self.data)],
                what="stop PostgreSQL",
            )

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------------------
    def _prepare_folder(self) -> None:
        """The folder, and the data directory owned by the account that runs the server
        (mode 0700, as PostgreSQL demands); as root, the folder traversable by it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(mode=0o700, exist_ok=True)
        if self.account is None:
            return
        self.folder.chmod(self.folder.stat().st_mode | 0o711)
        entry = pwd.getpwnam(self.account)
        os.chown(self.data, entry.pw_uid, entry.pw_gid)
        if self._run(["test", "-w", str(self.data)], check=False).returncode != 0:
            raise PostgresError(
                f"the account {self.account!r}, which runs PostgreSQL (it refuses root), "
                f"cannot reach {self.data}: a folder above it is closed to other users; "
                "choose a folder under /tmp or /srv"
            )

    def _initdb(self) -> None:
        secret = self.folder / ".password"
        secret.write_text(self.record.password + "\n")
        try:
            if self.account is not None:
                entry = pwd.getpwnam(self.account)
                os.chown(secret, entry.pw_uid, entry.pw_gid)
            secret.chmod(0o600)
            fast = [] if self.durable else ["--no-sync"]
            self._run(
                [
                    *("initdb", "-D", str(self.data), "-U", self.record.user),
                    *(f"--pwfile={secret}", "--auth-host=scram-sha-256", "--auth-local=peer"),
                    *("--encoding=UTF8", *fast),
                ],
                what=f"initialise {self.data}",
            )
        finally:
            secret.unlink(missing_ok=True)
        settings = ["listen_addresses = '127.0.0.1'", "unix_socket_directories = ''"]
        if not self.durable:
            settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# nas.storage.postgres\n" + "\n".join(settings) + "\n")
        # any address may ask (listen_addresses limits who can reach it), by password
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n")

    def _read_record(self) -> _Record | None:
        path = self.folder / "server.json"
        with contextlib.suppress(FileNotFoundError):
            try:
                return _Record(**json.loads(path.read_text()))
            except (ValueError, TypeError) as error:
                raise PostgresError(f"{path} is not a server record: {error}") from error
        return None

    def _write_record(self) -> None:
        path = self.folder / "server.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps(asdict(self.record)))

    def _run(
        self, argv: list[str], *, what: str = "", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        tool = str(self.bin / argv[0]) if argv[0] in (*_TOOLS, "pg_ctl") else argv[0]
        prefix = ["runuser", "-u", self.account, "--"] if self.account else []
        done = subprocess.run(
            [*prefix, tool, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=START_S + 30,
            cwd="/",
        )
        if check and done.returncode != 0:
            log = self.log.read_text()[-1500:] if self.log.exists() else ""
            raise PostgresError(
                f"could not {what or argv[0]} ({argv[0]} exited {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-1500:]}"
                + (f"\nserver log:\n{log}" if log else "")
            )
        return done


def _account() -> str | None:
    """Who runs the server: None (this user), or as root an unprivileged account."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            if shutil.which("runuser") is None:
                raise PostgresError("running as root needs `runuser` to start PostgreSQL")
            return name
    raise PostgresError("running as root, and no `postgres` or `nobody` account to run PostgreSQL")
