"""dedup/ is the PIP-6 core and Kafka's producer rules with no I/O: it imports the standard library, itself, the
generated protos (with the protobuf runtime they run on) and the one table of Kafka error codes (protocol.errors),
never `kop` nor the rest of `protocol` (docs/architecture.md#layers: kop -> dedup -> proto). Read from the source, so an import inside a function or
behind TYPE_CHECKING counts too."""

import ast
import pathlib
import sys

DEDUP = pathlib.Path(__file__).resolve().parent.parent / "dedup"
ALLOWED = {"dedup", "proto", "google", "protocol.errors"}  # google: google.protobuf


def imported_modules(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file: its top-level package, or the whole name when that is one of the
    allowed modules; relative imports stay inside the package."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            out.append((node.lineno, "dedup" if node.level else module if module in ALLOWED else module.split(".")[0]))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                "__import__", "import_module"):
            out.append((node.lineno, "<dynamic import>"))
    return out


def test_dedup_imports_only_the_standard_library_itself_and_proto():
    files = sorted(DEDUP.glob("*.py"))
    assert len(files) >= 5, files
    foreign = [f"{path.name}:{line} imports {module}" for path in files for line, module in imported_modules(path)
               if module not in ALLOWED and module not in sys.stdlib_module_names]
    assert not foreign, foreign


def test_the_check_sees_an_import_of_kop_wherever_it_is(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import asyncio\nfrom dedup import x\nfrom . import y\n"
                      "def f():\n    from kop.partition import PartitionLog\n    import kop\n"
                      "    __import__('kop')\nfrom protocol.errors import ErrorCode\nfrom protocol.records import z\n")
    assert imported_modules(source) == [(1, "asyncio"), (2, "dedup"), (3, "dedup"), (8, "protocol.errors"),
                                        (9, "protocol"), (5, "kop"), (6, "kop"), (7, "<dynamic import>")]
