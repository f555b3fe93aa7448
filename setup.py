"""The one compiled part of kop: protocol/_accel.c (the record walk of validation, an unzeroed buffer for requests),
used where it is built. It is optional: where no C compiler is found, the install goes on and kop does the same in
Python. Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("protocol._accel", ["protocol/_accel.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall"])])
