"""kafka-python's integration tests (from its PyPI sdist) against kop, through a small shim."""
