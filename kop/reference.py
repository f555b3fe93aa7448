"""The reference parts of docs/, rendered from the code so they cannot drift from it: in docs/operations.md the
options of `kop standalone`, every configuration key (from BrokerConfig's declarations and the Kafka keys of
kop/config_file.py) and every `kop admin` command (from their argparse parsers); in docs/compatibility.md the Kafka
APIs and versions served (from the handlers' routes, as ApiVersions answers them).

    python -m kop.reference            # print the generated sections
    python -m kop.reference --write    # rewrite them in docs/, between their marker comments
    python -m kop.reference --check    # exit 1 if a generated section in docs/ is stale (tests/test_docs.py too)
"""
import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import Field, fields
from pathlib import Path

from kafka.protocol.api_key import ApiKey

from kop.config import BrokerConfig, setting_key
from kop.config_checks import INT32_MAX, INT64_MAX, HostName, ListOf, Matches, OneOf, Range
from kop.config_file import KAFKA_KEYS

DOCS = Path(__file__).resolve().parent.parent / "docs"
USAGE_WIDTH = 1000  # one line per usage, whatever the terminal


# ---- configuration

def _number(value: int) -> str:
    return {INT32_MAX: "2^31-1", INT64_MAX: "2^63-1"}.get(value, str(value))


def _accepted(f: Field) -> str:
    check = f.metadata["check"]
    if f.type is bool:
        return "true, false"
    if isinstance(check, Range):
        no_limit = f", or {check.unbounded} (no limit)" if check.unbounded is not None else ""
        return f"{_number(check.low)} .. {_number(check.high)}{no_limit}"
    if isinstance(check, HostName):
        return "host name or IP address" + ("; empty" if check.empty_ok else "") + \
            ("; not 0.0.0.0 or ::" if not check.wildcard_ok else "")
    if isinstance(check, Matches | OneOf | ListOf):
        return check.description
    return "any " + ("integer" if f.type is int else "text")


def _default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if value != "" else "(empty)"


def _other_keys(f: Field) -> str:
    key = setting_key(f.name)
    spellings = [f.name.replace("_", "."), *f.metadata["keys"]]
    return ", ".join(f"`{k}`" for k in dict.fromkeys(spellings) if k != key)


def config_reference() -> str:
    rows = ["| key | also | type | default | accepted | what it does |", "|---|---|---|---|---|---|"]
    for f in fields(BrokerConfig):
        if f.name.startswith("test_"):  # knobs for kop's own tests (slow loads, short timeouts): not for operators
            continue
        rows.append(f"| `{setting_key(f.name)}` | {_other_keys(f)} | {f.type.__name__} | {_default(f.default)} | "
                    f"{_accepted(f)} | {f.metadata['doc']} |")
    rows += ["", "Kafka's keys that set the keys above:", "",
             "| key | what it sets |", "|---|---|"]
    rows += [f"| `{key}` | {spec.doc} |" for key, spec in KAFKA_KEYS.items()]
    return "\n".join(rows)


# ---- kop admin

def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip().replace(" [-h]", "")


def _examples(parser: argparse.ArgumentParser) -> list[str]:
    return [line.strip() for line in (parser.epilog or "").splitlines() if line.strip().startswith("kop ")]


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [f"`{', '.join(a.option_strings)}`: {a.help}" for a in parser._actions
            if a.option_strings and a.help and a.help != argparse.SUPPRESS and "-h" not in a.option_strings]


def _command(name: str) -> argparse.ArgumentParser:
    from kop.cli import build_parser  # here: kop.cli imports the whole command line
    return _subcommands(build_parser())[name]


def standalone_reference() -> str:
    standalone = _command("standalone")
    return "\n".join([f"`{_usage(standalone)}`", ""] + [f"- {option}" for option in _options(standalone)])


def admin_reference() -> str:
    admin = _command("admin")
    lines = [f"`{_usage(admin)}`", ""] + [f"- {option}" for option in _options(admin)]
    for group_name, group in _subcommands(admin).items():
        lines += ["", f"**{group_name}**: {group.description}", ""]
        for command in _subcommands(group).values():
            lines.append(f"- `{_usage(command)}`: {command.description}")
            lines += [f"  - {option}" for option in _options(command)]
            lines += [f"  - example: `{example}`" for example in _examples(command)]
    return "\n".join(lines)


# ---- Kafka APIs

def api_reference() -> str:
    from kop.handlers import build_api_router  # here: the handlers import most of the broker
    rows = ["| API | key | versions |", "|---|---:|---|"]
    from protocol.replication import REPLICATE_ENTRIES_KEY
    from protocol.txn_offsets import COMMIT_TXN_OFFSETS_KEY
    own = {REPLICATE_ENTRIES_KEY: "ReplicateEntries (kop's own, between clusters)",
           COMMIT_TXN_OFFSETS_KEY: "CommitTxnOffsets (kop's own, between the brokers of a cluster)"}
    for key, (low, high) in sorted(build_api_router().versions.items()):
        rows.append(f"| {own[key] if key in own else ApiKey(key).name} | {key} | {low}-{high} |")
    return "\n".join(rows)


# ---- the generated sections of docs/

SECTIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "standalone": ("operations.md", standalone_reference),
    "config": ("operations.md", config_reference),
    "admin": ("operations.md", admin_reference),
    "apis": ("compatibility.md", api_reference),
}


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated by `python -m kop.reference --write`: {name} -->",
            f"<!-- end of generated {name} -->")


def render(document: str, text: str) -> str:
    """`text` of docs/`document` with each of its generated sections rendered afresh between its markers;
    ValueError if a marker is missing."""
    for name, (where, generate) in SECTIONS.items():
        if where != document:
            continue
        begin, end = _markers(name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"the markers of the generated section {name!r} are missing: {begin} ... {end}")
        text = pattern.sub(lambda _match: f"{begin}\n{generate()}\n{end}", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kop.reference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the generated sections in docs/")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated section in docs/ is stale")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print("\n\n".join(generate() for _document, generate in SECTIONS.values()))
        return 0
    stale = []
    for document in dict.fromkeys(where for where, _generate in SECTIONS.values()):
        path = DOCS / document
        current = path.read_text(encoding="utf-8")
        fresh = render(document, current)
        if args.write and fresh != current:
            path.write_text(fresh, encoding="utf-8")
        elif fresh != current:
            stale.append(str(path))
    if stale:
        print(f"stale: {', '.join(stale)}; run python -m kop.reference --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
