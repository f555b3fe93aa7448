"""The `kop` command: `kop standalone` runs one broker on the embedded file storage (like `pulsar standalone`)."""
import argparse
import asyncio
import logging
import signal
import sys

from kop.broker import Broker
from kop.config import BrokerConfig, load_properties

log = logging.getLogger("kop")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def build_config(args: argparse.Namespace) -> BrokerConfig:
    config = load_properties(args.config) if args.config else BrokerConfig()
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
    return config.with_overrides(**overrides)


async def run_standalone(config: BrokerConfig) -> None:
    broker = Broker(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"kop standalone ready on {config.host}:{broker.port} data={config.data_dir}", flush=True)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    standalone = sub.add_parser("standalone", help="run one broker with embedded file storage")
    standalone.add_argument("--listen", type=parse_listen, help="HOST:PORT (default 127.0.0.1:9092)")
    standalone.add_argument("--data-dir", help="data directory (default ./data)")
    standalone.add_argument("--config", help="properties file (key=value)")
    standalone.add_argument("--advertised-host", help="host name clients should connect to")
    standalone.add_argument("--advertised-port", type=int, help="port clients should connect to (e.g. a proxy's)")
    standalone.add_argument("--admin-port", type=int, help="admin HTTP port (0 = off, -1 = any free port)")
    standalone.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command == "standalone":
        try:
            config = build_config(args)
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        asyncio.run(run_standalone(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
