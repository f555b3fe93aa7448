"""`kop pipeline ingest|transform|audit|demo`: the PySpark pipeline from the command line."""
import argparse
import json
import os
import sys

DEFAULT_FUNCTION = "kop.spark.examples:enrich_and_aggregate"


EXAMPLES = {
    "pipeline": "kop pipeline demo --orders 300",
    "ingest": "kop pipeline ingest --job orders --topic orders --key customer data/orders-1.jsonl data/orders-2.csv",
    "transform": "kop pipeline transform --job enrich --input orders --output totals --checkpoint build/ckpt",
    "audit": "kop pipeline audit --job orders --topic orders --report-dir build/audit --inputs data/orders-1.jsonl",
    "demo": "kop pipeline demo --work-dir build/pipeline-demo --orders 4000",
}


def _step(steps: "argparse._SubParsersAction", name: str, help: str) -> argparse.ArgumentParser:
    return steps.add_parser(name, help=help, description=help, epilog=f"examples:\n  {EXAMPLES[name]}\n",
                            formatter_class=argparse.RawDescriptionHelpFormatter)


def add_pipeline_parser(sub: "argparse._SubParsersAction") -> None:
    pipeline = _step(sub, "pipeline", "the PySpark pipeline: ingest, transform, audit, demo")
    steps = pipeline.add_subparsers(dest="step", required=True)

    ingest = _step(steps, "ingest", "input files (JSON lines, CSV, Parquet) -> a topic, each record once")
    _common(ingest)
    ingest.add_argument("--topic", required=True)
    ingest.add_argument("--key", help="the input field that becomes the record key")
    ingest.add_argument("--resume", action="store_true", help="skip what kop already stores (asks the admin API)")
    ingest.add_argument("inputs", nargs="+", metavar="FILE")

    transform = _step(steps, "transform", "a topic -> a function -> another topic, each output once")
    _common(transform)
    transform.add_argument("--input", required=True, help="input topic")
    transform.add_argument("--output", required=True, help="output topic")
    transform.add_argument("--checkpoint", required=True, help="Structured Streaming checkpoint directory")
    transform.add_argument("--function", default=DEFAULT_FUNCTION, help="MODULE:FUNCTION, DataFrame -> DataFrame "
                           f"(default {DEFAULT_FUNCTION})")

    audit = _step(steps, "audit", "read a topic back and compare it with its inputs")
    _common(audit)
    audit.add_argument("--topic", required=True, help="the topic to audit")
    audit.add_argument("--report-dir", required=True, help="where audit.json and audit.png go")
    expected = audit.add_mutually_exclusive_group(required=True)
    expected.add_argument("--inputs", nargs="+", metavar="FILE", help="the files an ingest job read")
    expected.add_argument("--input-topic", help="the topic a transform job read")
    audit.add_argument("--key", help="the ingest job's --key")
    audit.add_argument("--function", default=DEFAULT_FUNCTION, help="the transform job's --function")

    demo = _step(steps, "demo", "ingest -> transform -> audit on generated data, with injected failures")
    demo.add_argument("--work-dir", default="build/pipeline-demo", help="data, checkpoints, brokers and reports")
    demo.add_argument("--orders", type=int, default=4000, help="orders per input file (two files)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="kop's Kafka address")
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080", help="kop's admin REST API")
    parser.add_argument("--job", required=True, help="the job's name: the first part of its producer names")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of an output topic the job creates")
    parser.add_argument("--no-sequence-ids", action="store_true",
                        help="write without sequence-id headers (at least once: re-runs store duplicates)")
    parser.add_argument("--kafka", action="append", default=[], metavar="KEY=VALUE",
                        help="a producer property, e.g. compression.type=zstd")
    parser.add_argument("--master", default="local[2,4]", help="Spark master (local[N,maxFailures] retries tasks)")
    parser.add_argument("--speculation", action="store_true", help="Spark's speculative execution")
    # Failure injection, for the demo and the tests.
    parser.add_argument("--fail-task-after", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--row-delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)


def run_pipeline(args: argparse.Namespace) -> int:
    from kop.spark.options import OptionError
    try:
        return STEPS[args.step](args)
    except (OptionError, OSError) as exc:
        print(f"kop pipeline {args.step}: {exc}", file=sys.stderr)
        return 2


def _ingest(args: argparse.Namespace) -> int:
    from kop.spark.ingest import IngestJob, run_ingest
    from kop.spark.progress import spark_progress
    spark = _session(args)
    job = IngestJob(name=args.job, inputs=args.inputs, topic=args.topic, bootstrap=args.bootstrap,
                    admin_url=args.admin_url, key_field=args.key, partitions=args.partitions,
                    sequence_ids=not args.no_sequence_ids, resume=args.resume, kafka_options=_kafka(args))
    with spark_progress(spark, f"ingest {len(args.inputs)} file(s) -> {args.topic}"):
        result = run_ingest(spark, job, _faults(args))
    print(json.dumps({"records": result.records, "written": result.written}))
    return 0


def _transform(args: argparse.Namespace) -> int:
    from kop.spark.progress import spark_progress
    from kop.spark.transform import TransformJob, load_function, run_transform
    spark = _session(args)
    job = TransformJob(name=args.job, input_topic=args.input, output_topic=args.output, bootstrap=args.bootstrap,
                       checkpoint=args.checkpoint, function=load_function(args.function), partitions=args.partitions,
                       sequence_ids=not args.no_sequence_ids, kafka_options=_kafka(args))
    with spark_progress(spark, f"transform {args.input} -> {args.output}"):
        result = run_transform(spark, job, _faults(args))
    print(json.dumps({"batches": result.batches, "records_in": result.records_in,
                      "records_out": result.records_out}))
    return 0


def _audit(args: argparse.Namespace) -> int:
    from kop.spark.audit import audit
    from kop.spark.progress import spark_progress
    from kop.spark.report import write_chart, write_json
    spark = _session(args)
    with spark_progress(spark, f"audit {args.topic}"):
        report = audit(spark, _expected(spark, args), args.bootstrap, args.topic)
    os.makedirs(args.report_dir, exist_ok=True)
    write_json(report, os.path.join(args.report_dir, "audit.json"))
    write_chart(report, os.path.join(args.report_dir, "audit.png"), title=f"{args.job}: {args.topic}")
    print(json.dumps({"stored": report.stored, "expected": report.expected, "duplicates": report.duplicates,
                      "missing": report.missing}))
    return 0 if report.exactly_once else 1


def _expected(spark, args: argparse.Namespace):
    if args.inputs:
        from kop.spark.ingest import IngestJob, source_records
        return source_records(spark, IngestJob(name=args.job, inputs=args.inputs, topic=args.topic,
                                               bootstrap=args.bootstrap, key_field=args.key))
    from kop.spark.transform import expected_outputs, load_function
    return expected_outputs(spark, args.job, args.input_topic, args.bootstrap, load_function(args.function))


def _demo(args: argparse.Namespace) -> int:
    from kop.spark.demo import run_demo
    return 0 if run_demo(args.work_dir, args.orders) else 1


def _session(args: argparse.Namespace):
    from kop.spark.session import SparkSettings, spark_session
    return spark_session(SparkSettings(master=args.master, speculation=args.speculation))


def _faults(args: argparse.Namespace):
    from kop.spark.faults import Faults
    return Faults(fail_after_rows=args.fail_task_after, row_delay_ms=args.row_delay_ms)


def _kafka(args: argparse.Namespace) -> dict[str, str]:
    from kop.spark.options import OptionError
    pairs = [item.partition("=") for item in args.kafka]
    if any(not sep or not key for key, sep, _ in pairs):
        raise OptionError(f"--kafka takes KEY=VALUE, got {args.kafka}")
    return {key: value for key, _, value in pairs}


STEPS = {"ingest": _ingest, "transform": _transform, "audit": _audit, "demo": _demo}
