"""Every input a fuzzer found that broke an oracle (tests/fuzz_inputs/TARGET/NAME, the bytes atheris saved, named
for the bug) passes its target now, and stays passing. `python -m fuzz --replay TARGET FILE` replays one by hand."""
from pathlib import Path

import pytest

from fuzz.targets import TARGETS

INPUTS = Path(__file__).parent / "fuzz_inputs"
SAVED = sorted(path for path in INPUTS.glob("*/*") if path.is_file())


def test_every_saved_input_belongs_to_a_target():
    assert SAVED and {path.parent.name for path in SAVED} <= set(TARGETS)


@pytest.mark.parametrize("path", SAVED, ids=[f"{p.parent.name}/{p.name}" for p in SAVED])
def test_a_saved_input_passes_its_oracle(path):
    TARGETS[path.parent.name](path.read_bytes())
