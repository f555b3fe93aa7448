"""The options of `kop perf produce` and `kop perf consume`: their argparse parsers and the validated values."""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field

INT64_MAX = (1 << 63) - 1
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")


class PerfError(Exception):
    """A problem the user can fix (a bad option, an unreachable broker, a missing topic): one line, exit status 2."""


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad option values give one line on stderr and exit status 2 (argparse's status), without the usage block."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


@dataclass(frozen=True)
class Output:
    json_path: str | None = None  # "-" is stdout
    plot_path: str | None = None


@dataclass(frozen=True)
class ProduceOptions:
    bootstrap_server: str
    topic: str
    num_records: int | None  # None: until --duration or Ctrl-C
    duration_s: float | None
    record_size: int
    throughput: float  # records/s; -1: as fast as the client can
    client_config: dict[str, str]  # librdkafka properties, the options' and --producer-property's
    partitions: int | None  # create the topic with this many partitions if it is missing
    replication_factor: int
    transactional_id: str | None
    transaction_duration_ms: int
    sequence_headers: str | None  # the kop.producer.name value; None: no sequence headers
    sequence_start: int
    output: Output = field(default_factory=Output)

    @property
    def paced(self) -> bool:
        return self.throughput > 0


@dataclass(frozen=True)
class ConsumeOptions:
    bootstrap_server: str
    topic: str
    messages: int | None  # None: until --duration, --timeout or Ctrl-C
    duration_s: float | None
    idle_timeout_s: float
    client_config: dict[str, str]
    output: Output = field(default_factory=Output)


# ---- value parsers (argparse turns their ArgumentTypeError into a one-line error)


def _checked(convert: type, accept, expected: str):
    """An argparse type: `convert` the text, then `accept` the value, else one line saying what was `expected`."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_positive_int = _checked(int, lambda v: 0 < v <= INT64_MAX, "a positive integer")
_non_negative_int = _checked(int, lambda v: 0 <= v <= INT64_MAX, "an integer >= 0")
_positive_seconds = _checked(float, lambda v: 0 < v < math.inf, "a number of seconds > 0")
_throughput = _checked(float, lambda v: v == -1 or 0 < v < math.inf, "records/s > 0 or -1 (unpaced)")


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _on_off(text: str) -> bool:
    answers = {"on": True, "true": True, "off": False, "false": False}
    if text.lower() not in answers:
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return answers[text.lower()]


def _non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a non-empty name")
    return text


# ---- parsers

PRODUCE_EXAMPLES = """\
Every second a line with records/s, MB/s (2**20 bytes, as Kafka's perf tools count) and the send-to-ack latency
percentiles of the records acknowledged in that second; a summary over the whole run at the end. Exit status: 0,
1 if a record could not be delivered, 2 for a bad option, an unreachable broker or a missing topic.

examples:
  # one million 100-byte records as fast as the client can, onto a topic created with 4 partitions if missing
  kop perf produce --topic perf --partitions 4 --num-records 1000000 --record-size 100

  # 60 s at 10,000 records/s, idempotent, lz4, with the per-second samples as JSON and a chart
  kop perf produce --topic perf --duration 60 --throughput 10000 --idempotence on --compression lz4 --json p.json
  kop perf produce --topic perf --duration 60 --throughput 10000 --plot produce.png     # the same, charted

  # records carrying application sequence ids (headers kop.producer.name=orders, kop.sequence.id=1000, 1001, ...)
  kop perf produce --topic orders --num-records 50000 --sequence-headers orders --sequence-start 1000

  # any librdkafka producer setting, as kafka-producer-perf-test's --producer-props
  kop perf produce --topic perf --num-records 100000 --producer-property linger.ms=20 --producer-property acks=1

--transactional-id sends inside transactions, committed every --transaction-duration-ms.
"""

CONSUME_EXAMPLES = """\
Every second a line with records/s, MB/s (2**20 bytes) and the percentiles of now minus each record's timestamp:
the end-to-end latency when a producer runs at the same time (both clocks are the machine's wall clock, so across
machines they are only as good as the clocks' agreement); a summary at the end. Exit status: 0, 1 if --messages
were not all received before --timeout, 2 for a bad option, an unreachable broker or a missing topic.

examples:
  # read 1,000,000 records from the start of the topic
  kop perf consume --topic perf --from-beginning --messages 1000000

  # end-to-end latency: consume new records while `kop perf produce --throughput 10000` runs elsewhere
  kop perf consume --topic perf --duration 60 --json consume.json --plot consume.png

  # join an existing group; any librdkafka consumer setting
  kop perf consume --topic perf --group readers --consumer-property fetch.min.bytes=65536
"""


def add_perf_parser(commands: argparse._SubParsersAction) -> None:
    perf = commands.add_parser("perf", help="measure produce and consume throughput and latency",
                               description="Throughput and latency of any Kafka-compatible broker (kop or Kafka), "
                                           "measured with librdkafka, like kafka-producer-perf-test, "
                                           "kafka-consumer-perf-test and pulsar-perf.",
                               epilog="examples:\n"
                                      "  kop perf produce --topic t --num-records 100000 --record-size 1024\n"
                                      "  kop perf consume --topic t --messages 100000 --from-beginning\n",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    tools = perf.add_subparsers(dest="perf_command", required=True, metavar="{produce,consume}",
                                parser_class=OneLineErrorParser)
    _add_produce(tools)
    _add_consume(tools)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT[,...]",
                        help="the brokers to start from (default 127.0.0.1:9092)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--duration", type=_positive_seconds, metavar="SECONDS", help="stop after this long")
    parser.add_argument("--json", metavar="FILE|-", help="write the per-second samples and the summary as JSON "
                                                         "(- for stdout; the progress lines then go to stderr)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw throughput and latency over time into a PNG")


def _add_produce(tools: argparse._SubParsersAction) -> None:
    p = tools.add_parser("produce", help="produce records and measure send-to-ack latency",
                         description="Produce records and measure throughput and send-to-ack latency.",
                         epilog=PRODUCE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--num-records", type=_positive_int, metavar="N",
                   help="records to send (with --duration, whichever ends first; neither: until Ctrl-C)")
    p.add_argument("--record-size", type=_positive_int, default=100, metavar="BYTES",
                   help="value size of each record (default 100)")
    p.add_argument("--throughput", type=_throughput, default=-1, metavar="RECORDS_PER_S",
                   help="pace sends at this rate; -1 (default): as fast as the client can")
    p.add_argument("--acks", choices=("all", "-1", "0", "1"), default="all", help="default all")
    p.add_argument("--batch-size", type=_positive_int, metavar="BYTES", help="librdkafka batch.size")
    p.add_argument("--linger-ms", type=_non_negative_int, metavar="MS", help="librdkafka linger.ms")
    p.add_argument("--compression", choices=COMPRESSION_TYPES, default="none", help="default none")
    p.add_argument("--idempotence", type=_on_off, metavar="{on,off}",
                   help="default off, on with --transactional-id")
    p.add_argument("--producer-property", type=_property, action="append", default=[], metavar="KEY=VALUE",
                   help="any librdkafka producer setting; repeatable; overrides the options above")
    p.add_argument("--partitions", type=_positive_int, metavar="N",
                   help="create the topic with N partitions if it does not exist (without it a missing topic is "
                        "an error)")
    p.add_argument("--replication-factor", type=_positive_int, metavar="N",
                   help="replication factor of a topic --partitions creates (default: the broker's)")
    p.add_argument("--transactional-id", type=_non_empty, metavar="ID",
                   help="send inside transactions committed every --transaction-duration-ms")
    p.add_argument("--transaction-duration-ms", type=_positive_int, default=3000, metavar="MS",
                   help="commit a transaction this often (default 3000)")
    p.add_argument("--sequence-headers", type=_non_empty, metavar="NAME",
                   help="give every record the headers kop.producer.name=NAME and kop.sequence.id=<its index from "
                        "--sequence-start>, the application sequence ids kop deduplicates by")
    p.add_argument("--sequence-start", type=_non_negative_int, default=0, metavar="ID",
                   help="the first record's kop.sequence.id (default 0)")
    p.set_defaults(perf_options=produce_options)


def _add_consume(tools: argparse._SubParsersAction) -> None:
    p = tools.add_parser("consume", help="consume records and measure end-to-end latency",
                         description="Consume records in a consumer group and measure throughput and the latency "
                                     "from each record's timestamp to its arrival.",
                         epilog=CONSUME_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--messages", type=_positive_int, metavar="N",
                   help="records to consume (with --duration, whichever ends first; neither: until --timeout or "
                        "Ctrl-C)")
    p.add_argument("--group", type=_non_empty, help="consumer group (default: a new kop-perf-<random> group)")
    p.add_argument("--from-beginning", action="store_true",
                   help="start where the group has no committed offset from the oldest record, not the next new one")
    p.add_argument("--timeout", type=_positive_seconds, default=10.0, metavar="SECONDS",
                   help="stop when no record arrived for this long (default 10)")
    p.add_argument("--consumer-property", type=_property, action="append", default=[], metavar="KEY=VALUE",
                   help="any librdkafka consumer setting; repeatable; overrides the options above")
    p.set_defaults(perf_options=consume_options)


# ---- namespace -> options


def _output(args: argparse.Namespace) -> Output:
    for path in (args.json, args.plot):
        if path and path != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise PerfError(f"cannot write {path}: its directory does not exist")
    if args.plot == "-":
        raise PerfError("--plot needs a file name")
    return Output(args.json, args.plot)


def produce_options(args: argparse.Namespace) -> ProduceOptions:
    if args.sequence_headers and args.num_records and args.sequence_start + args.num_records - 1 > INT64_MAX:
        raise PerfError("--sequence-start + --num-records passes the largest int64 sequence id")
    idempotence = bool(args.transactional_id) if args.idempotence is None else args.idempotence
    if args.transactional_id and not idempotence:
        raise PerfError("--transactional-id needs --idempotence on")
    if idempotence and args.acks not in ("all", "-1"):
        raise PerfError(f"--idempotence on needs --acks all (got --acks {args.acks})")
    config = {"acks": args.acks, "compression.type": args.compression, "enable.idempotence": str(idempotence).lower()}
    if args.batch_size is not None:
        config["batch.size"] = str(args.batch_size)
    if args.linger_ms is not None:
        config["linger.ms"] = str(args.linger_ms)
    if args.transactional_id:
        config["transactional.id"] = args.transactional_id
    config.update(args.producer_property)
    return ProduceOptions(
        bootstrap_server=args.bootstrap_server, topic=args.topic, num_records=args.num_records,
        duration_s=args.duration, record_size=args.record_size, throughput=args.throughput, client_config=config,
        partitions=args.partitions, replication_factor=args.replication_factor or -1,
        transactional_id=config.get("transactional.id"), transaction_duration_ms=args.transaction_duration_ms,
        sequence_headers=args.sequence_headers, sequence_start=args.sequence_start, output=_output(args))


def consume_options(args: argparse.Namespace) -> ConsumeOptions:
    config = {"group.id": args.group or f"kop-perf-{os.urandom(4).hex()}",
              "auto.offset.reset": "earliest" if args.from_beginning else "latest"}
    config.update(args.consumer_property)
    return ConsumeOptions(
        bootstrap_server=args.bootstrap_server, topic=args.topic, messages=args.messages, duration_s=args.duration,
        idle_timeout_s=args.timeout, client_config=config, output=_output(args))
