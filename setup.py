"""The one compiled part of kop: the record walk in C (protocol/_walk.c), which validation uses when it is built.
It is optional: where no C compiler is found, the install goes on and protocol/records.py walks records in Python.
Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("protocol._walk", ["protocol/_walk.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall"])])
