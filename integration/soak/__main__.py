"""`python -m integration.soak [--topology single|geo|cluster] [--seconds N] [--seed S]`: the nemesis soak; exit
status 1 when a check fails, 2 when the topology cannot run here."""
import argparse
import logging
import os
import random
import sys
import tempfile

from integration.soak.cluster import Unavailable, run_cluster_soak
from integration.soak.geo import run_geo_soak
from integration.soak.producers import PRODUCERS
from integration.soak.run import UnknownFaults, run_soak

TOPOLOGIES = {"single": run_soak, "geo": run_geo_soak, "cluster": run_cluster_soak}


def _setting(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"want KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m integration.soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)),
                        help="how long the faults run (default: $SOAK_SECONDS or 600)")
    parser.add_argument("--seed", type=int, default=None, help="replay the schedule of an earlier run")
    parser.add_argument("--clients", nargs="+", choices=sorted(PRODUCERS), default=sorted(PRODUCERS))
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES), default="single",
                        help="one broker (default); geo: two clusters that replicate, the group failing over; "
                             "cluster: three brokers on a PostgreSQL the soak starts")
    parser.add_argument("--two-way", action="store_true", help="geo: replicate both ways, producers in both")
    parser.add_argument("--faults", nargs="+", default=None,
                        help="the fault kinds the schedule draws from (default: every kind of the topology)")
    parser.add_argument("--work-dir", default=None, help="where the brokers' data and logs go (default: a temp dir)")
    parser.add_argument("--broker-config", nargs="*", default=[], metavar="KEY=VALUE", type=_setting,
                        help="broker settings, e.g. brokerDeduplicationEnabled=false for a run that must fail")
    args = parser.parse_args(argv)
    # The clients' own warnings (a retried error, a lost connection) on stderr, next to the faults that caused them.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="kop-soak-")
    extra = {"two_way": True} if args.two_way else {}
    if args.two_way and args.topology != "geo":
        parser.error("--two-way is for --topology geo")
    try:
        result = TOPOLOGIES[args.topology](work_dir, args.seconds, seed, args.clients,
                                           broker_config=dict(args.broker_config), faults=args.faults, **extra)
    except Unavailable as exc:
        print(f"the {args.topology} soak cannot run here: {exc}")
        return 2
    except UnknownFaults as exc:
        parser.error(str(exc))
    print(result.report())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
