"""The `kop` command: `kop standalone` runs one broker on the embedded file storage (like `pulsar standalone`), with
its admin REST API on port 8080; `kop admin ...` talks to that API (like `pulsar-admin`); `kop perf produce|consume`
measures any Kafka-compatible broker (like kafka-producer-perf-test and pulsar-perf); `kop pipeline ...` runs the
PySpark pipeline."""
import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, NoReturn

from kop.admin.cli import add_admin_parser, run_admin
from kop.config import BrokerConfig, parse_setting
from kop.config_file import read_properties, unknown_key_warnings
from kop.security.listeners import split_host_port
from kop.logs import LOG_FORMATS, configure_logging
from kop.perf.options import add_perf_parser
from kop.spark.cli import add_pipeline_parser, run_pipeline
from kop.startup import StartupError

STANDALONE_ADMIN_PORT = 8080  # pulsar standalone's web service port
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LISTEN_HOST = "127.0.0.1"

log = logging.getLogger("kop")


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2, like every other start-up failure; the usage itself
    is in --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def setting_argument(name: str, what: str = "") -> Callable[[str], Any]:
    """An argparse type for BrokerConfig field `name`: converted and checked as the properties file's value is."""
    def parse(raw: str) -> Any:
        try:
            return parse_setting(name, raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}{exc}") from None
    return parse


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`; an empty host is 127.0.0.1."""
    try:
        host, port = split_host_port(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return setting_argument("host", "host: ")(host or DEFAULT_LISTEN_HOST), setting_argument("port", "port: ")(str(port))


@dataclass(frozen=True)
class Standalone:
    """What `kop standalone` runs: the checked configuration and what to say about it once the broker holds its
    data directory and ports (so a start-up failure stays one line)."""

    config: BrokerConfig
    admin_port_may_be_taken: bool  # the default admin port gives way when in use; one asked for does not
    warnings: list[str]
    explicit: frozenset[str]  # the fields the properties file or the command line set (DescribeConfigs' sources)


def build_config(args: argparse.Namespace) -> Standalone:
    """The properties file, then the command line over it; ValueError names the first value kop cannot run with."""
    properties = read_properties(args.config) if args.config else None
    values = dict(properties.values) if properties else {}
    if args.listen:
        values["host"], values["port"] = args.listen
    cli_values = {"data_dir": args.data_dir, "storage": args.storage, "advertised_host": args.advertised_host,
                  "advertised_port": args.advertised_port, "admin_port": args.admin_port,
                  "cluster_name": args.cluster_name}
    values.update((name, value) for name, value in cli_values.items() if value is not None)
    admin_default = "admin_port" not in values
    explicit = frozenset(values)
    values.setdefault("admin_port", STANDALONE_ADMIN_PORT)
    warnings = unknown_key_warnings(args.config, properties) if properties else []
    return Standalone(BrokerConfig(**values), admin_default, warnings, explicit)


def raise_open_files_limit() -> None:
    """Every client connection is a file descriptor, and the usual soft limit (1024) would have the OS refuse clients
    long before max_connections: take all that the hard limit allows."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An unlimited hard limit is refused as a soft limit on Linux (fs.nr_open caps it); 2**20 is nr_open's default.
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("open files limit %s, already the most the hard limit allows", soft)
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("open files limit stays %d: raising it to %d failed (%s)", soft, target, exc)
        return
    log.info("open files limit raised from %d to %d (hard limit %s)", soft, target,
             "unlimited" if hard == resource.RLIM_INFINITY else hard)


async def run_standalone(standalone: Standalone) -> None:
    from kop.broker import Broker  # here, so `kop admin` starts without loading the broker
    config = standalone.config
    broker = Broker(config, admin_port_may_be_taken=standalone.admin_port_may_be_taken,
                    explicit_settings=standalone.explicit)
    await broker.bind()  # the data directory and the ports first: a failure here is reported before any log line
    for warning in standalone.warnings:
        log.warning("%s", warning)
    raise_open_files_limit()  # before loading: every ledger file open at load is a file descriptor too
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A stop asked for while the partitions load (an orchestrator giving up on a slow start) ends the load and stops
    # the broker cleanly, as one asked for later does.
    starting = asyncio.create_task(broker.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        starting.result()  # a StartupError goes to main
        admin = f" admin=http://{config.host}:{broker.admin_port}" if broker.admin_port else ""
        # What start-up loaded (modules, topics, state) mostly lives as long as the process: out of the collector's
        # generations, the collections that requests' allocations trigger do not walk it again each time (8 % of the
        # instructions per 100 B record). A partition that closes gives it back (PartitionLog.close).
        gc.freeze()
        print(f"kop standalone ready on {config.host}:{broker.port} data={config.data_dir}{admin}", flush=True)
        await stopping
    else:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        log.info("stopped while starting")
    log.info("shutting down")
    await broker.stop()


def version() -> str:
    try:
        return metadata.version("kop")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


EPILOG = """examples:
  kop standalone                                   # 127.0.0.1:9092, data in ./data, admin API on :8080
  kop standalone --config server.properties        # Kafka's or Pulsar's keys; see kop standalone --help
  kop admin topics stats public/default/orders     # see kop admin --help
  kop perf produce --topic t --num-records 100000  # see kop perf --help
  kop pipeline demo                                # see kop pipeline --help
  kop --version

`kop` alone prints this help and exits with status 0.
"""

STANDALONE_EPILOG = f"""examples:
  kop standalone
  kop standalone --listen 127.0.0.1:9093 --data-dir /var/lib/kop --admin-port 0
  kop standalone --listen 0.0.0.0:9092 --advertised-host kafka.example.com
  kop standalone --config server.properties --log-level DEBUG

The properties file takes kop's keys (kop/config.py) and the Kafka and Pulsar keys they mirror, among them Kafka's
listeners=NAME://HOST:PORT,... (with listener.security.protocol.map), advertised.listeners and log.dirs (one
directory); the command line overrides it (--listen moves the first listener). Every value is checked: a value out
of range, two keys that disagree (broker.id and node.id), several data directories or a listener kop cannot serve
stop the start. An unknown key is logged as a warning (with the
nearest known key when it looks like a typo) and ignored.

The data directory is locked (<data-dir>/.lock holds the broker's pid): a second broker on it is refused. Its
parent directory must exist. The Kafka and admin ports are bound before any data is read. When the default admin
port {STANDALONE_ADMIN_PORT} is in use the broker runs without the admin API; a port asked for must be free.

Every start-up failure (a bad argument or value, an unreadable config file, a port in use or not of this machine, a
data directory that is missing its parent, not a directory, not writable or in use, a data file that cannot be read
or parsed) is one line on stderr and exit status 2. SIGTERM or SIGINT stops the broker cleanly, also while it loads.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="kop", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kop {version()}")
    sub = parser.add_subparsers(dest="command", metavar="{standalone,admin,perf,pipeline}")
    standalone = sub.add_parser("standalone", help="run one broker with embedded file storage",
                                description="Run one broker with embedded file storage.", epilog=STANDALONE_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    standalone.add_argument("--listen", type=parse_listen, metavar="HOST:PORT",
                            help=f"where Kafka clients connect (default {DEFAULT_LISTEN_HOST}:9092; an empty host is "
                                 f"{DEFAULT_LISTEN_HOST}, port 0 any free port)")
    standalone.add_argument("--data-dir", type=setting_argument("data_dir"), metavar="DIR", help="data directory (default ./data)")
    standalone.add_argument("--storage", type=setting_argument("storage"), metavar="ENGINE",
                            help="file (default: ledgers in the data directory) or postgresql://USER@HOST:PORT/DB")
    standalone.add_argument("--config", metavar="FILE", help="properties file (key=value lines)")
    standalone.add_argument("--advertised-host", type=setting_argument("advertised_host"), metavar="HOST",
                            help="host name clients are told to connect to (default: the --listen host)")
    standalone.add_argument("--advertised-port", type=setting_argument("advertised_port"), metavar="PORT",
                            help="port clients are told to connect to, e.g. a proxy's (default: the --listen port)")
    standalone.add_argument("--admin-port", type=setting_argument("admin_port"), metavar="PORT",
                            help=f"admin HTTP port (default {STANDALONE_ADMIN_PORT}; 0 = off, -1 = any free port)")
    standalone.add_argument("--cluster-name", type=setting_argument("cluster_name"), metavar="NAME",
                            help="the cluster this broker belongs to, as other clusters name it in geo-replication "
                                 "(default standalone)")
    standalone.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                            help="the least severe log lines written to stderr: DEBUG, INFO (default), WARNING or "
                                 "ERROR")
    standalone.add_argument("--log-format", type=str.lower, choices=LOG_FORMATS, default="text",
                            help="text (default): one line per event; json: one JSON object per line (time, level, "
                                 "logger, message and the event's fields, such as client_id and addr)")
    add_admin_parser(sub)
    add_perf_parser(sub)
    add_pipeline_parser(sub)
    return parser


def fail(message: str) -> int:
    print(f"kop standalone: error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "admin":
        return run_admin(args)
    if args.command == "perf":
        from kop.perf.cli import run_perf  # here, so the broker starts without loading the clients and numpy
        return run_perf(args)
    if args.command == "pipeline":
        return run_pipeline(args)
    try:
        standalone = build_config(args)
    except ValueError as exc:
        return fail(str(exc))
    configure_logging(args.log_level, args.log_format)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(run_standalone(standalone))
    except StartupError as exc:
        return fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
