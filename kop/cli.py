"""The `kop` command: `kop standalone` runs one broker on the embedded file storage (like `pulsar standalone`), with
its admin REST API on port 8080; `kop admin ...` talks to that API (like `pulsar-admin`)."""
import argparse
import asyncio
import errno
import logging
import signal
import socket
import sys

from kop.admin.cli import add_admin_parser, run_admin
from kop.config import BrokerConfig, load_properties, unknown_keys
from kop.spark.cli import add_pipeline_parser, run_pipeline

STANDALONE_ADMIN_PORT = 8080  # pulsar standalone's web service port

log = logging.getLogger("kop")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def build_config(args: argparse.Namespace) -> BrokerConfig:
    unset = -2  # tells "the file did not set the admin port" apart from every value it could set
    config = load_properties(args.config, BrokerConfig(admin_port=unset)) if args.config else BrokerConfig(
        admin_port=unset)
    for key in unknown_keys(config):
        # Not an error: configs copied from Kafka or Pulsar carry many keys kop does not implement.
        log.warning("%s: unknown key %s is ignored", args.config, key)
    overrides = {}
    if args.listen:
        overrides["host"], overrides["port"] = args.listen
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    if args.advertised_host:
        overrides["advertised_host"] = args.advertised_host
    if args.advertised_port:
        overrides["advertised_port"] = args.advertised_port
    if args.admin_port is not None:
        overrides["admin_port"] = args.admin_port
    config = config.with_overrides(**overrides)
    if config.admin_port == unset:
        config = config.with_overrides(admin_port=STANDALONE_ADMIN_PORT)
        if _port_in_use(config.host, STANDALONE_ADMIN_PORT):
            # Only the default gives way: a second standalone on one machine still starts, without its admin API.
            log.warning("admin port %d is in use; running without the admin API (set --admin-port)",
                        STANDALONE_ADMIN_PORT)
            config = config.with_overrides(admin_port=0)
    return config


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's listener will
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


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


async def run_standalone(config: BrokerConfig) -> None:
    from kop.broker import Broker  # here, so `kop admin` starts without loading the broker
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    admin = f" admin=http://{config.host}:{broker.admin_port}" if broker.admin_port else ""
    print(f"kop standalone ready on {config.host}:{broker.port} data={config.data_dir}{admin}", flush=True)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    standalone = sub.add_parser("standalone", help="run one broker with embedded file storage")
    standalone.add_argument("--listen", type=parse_listen, help="HOST:PORT (default 127.0.0.1:9092)")
    standalone.add_argument("--data-dir", help="data directory (default ./data)")
    standalone.add_argument("--config", help="properties file (key=value)")
    standalone.add_argument("--advertised-host", help="host name clients should connect to")
    standalone.add_argument("--advertised-port", type=int, help="port clients should connect to (e.g. a proxy's)")
    standalone.add_argument("--admin-port", type=int,
                            help=f"admin HTTP port (default {STANDALONE_ADMIN_PORT}; 0 = off, -1 = any free port)")
    standalone.add_argument("--log-level", default="INFO")
    add_admin_parser(sub)
    add_pipeline_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "admin":
        return run_admin(args)
    if args.command == "pipeline":
        return run_pipeline(args)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command == "standalone":
        try:
            config = build_config(args)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        raise_open_files_limit()
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        asyncio.run(run_standalone(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
