"""The servers a study shared by many workers runs on: `python -m nas.storage.server ...`.

Two commands, each printing what `study.storage=` takes:

    postgres --dir D [--port P] [--host H] [--no-fsync] [--detach | --stop]
        a throw-away PostgreSQL server with its data in D (`nas.storage.postgres`); it prints its
        URL (password included: keep it to yourself) and runs until Ctrl-C or SIGTERM, or
        with --detach returns at once, leaving the server running until `--stop`. Started
        again on the same folder it has the same URL and the same studies. --no-fsync (set
        when the folder is made): faster, but a crash of the machine may lose the data.
    serve --storage URL --port P [--host H] [--wait-s S]
        Optuna's gRPC storage proxy in front of the database at URL: workers then use
        `study.storage=grpc://<this host>:P` and need no database driver or credentials.
        The proxy's own calls to the database wait out an outage of up to S seconds
        (`nas.storage.retrying`); it prints `grpc://H:P` once it answers.

Errors (a folder PostgreSQL cannot use, a URL that cannot be opened) are one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from types import FrameType

from nas.storage.postgres import Postgres, PostgresError

__all__ = ["main", "serve"]


def serve(url: str, *, host: str = "0.0.0.0", port: int = 13000, wait_s: float = 60.0) -> None:
    """Run Optuna's gRPC storage proxy for the database at `url` until interrupted."""
    import optuna

    from nas.storage import url as storage_url
    from nas.storage.opening import make_storage
    from nas.storage.url import StorageKind

    if storage_url.kind(url) in (StorageKind.GRPC, StorageKind.JOURNAL):
        raise ValueError(
            f"--storage={storage_url.masked(url)} is not valid for the proxy; it serves a "
            "database: sqlite:///path.db or a server's URL (postgresql://...)"
        )
    backend = make_storage(url, wait_s=wait_s)
    reach = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    def announce() -> None:
        client = optuna.storages.GrpcStorageProxy(host=reach, port=port)
        try:
            client.wait_server_ready(timeout=60)
        except ConnectionError:
            return
        finally:
            client.close()
        print(f"grpc://{reach}:{port}", flush=True)

    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the proxy's
    threading.Thread(target=announce, daemon=True, name="announce").start()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the proxy ends, quietly
        optuna.storages.run_grpc_proxy_server(backend, host=host, port=port)


def _postgres(args: argparse.Namespace) -> None:
    server = Postgres(args.dir, port=args.port, host=args.host, durable=not args.no_fsync)
    if args.stop:
        server.stop()
        return
    server.start()
    print(server.url, flush=True)
    if args.detach:
        return
    stop = threading.Event()

    def finish(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    try:
        stop.wait()
    finally:
        server.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nas.storage.server", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    pg = commands.add_parser("postgres", help="a throw-away PostgreSQL server")
    pg.add_argument("--dir", required=True, help="its folder (data, password, port)")
    pg.add_argument("--port", type=int, default=None, help="default: as before, else a free one")
    pg.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    pg.add_argument("--no-fsync", action="store_true", help="faster; a crash may lose data")
    once = pg.add_mutually_exclusive_group()
    once.add_argument("--detach", action="store_true", help="start, print the URL, return")
    once.add_argument("--stop", action="store_true", help="stop the server running in --dir")
    proxy = commands.add_parser("serve", help="Optuna's gRPC storage proxy for a database")
    proxy.add_argument("--storage", required=True, help="the database's URL")
    proxy.add_argument("--port", type=int, default=13000)
    proxy.add_argument("--host", default="0.0.0.0", help="address to listen on")
    proxy.add_argument("--wait-s", type=float, default=60.0, help="outage waited out (s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # the proxy's waits for its database (nas.storage.retrying) reach stderr with the time
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        if args.command == "postgres":
            _postgres(args)
        else:
            serve(args.storage, host=args.host, port=args.port, wait_s=args.wait_s)
    except (PostgresError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
