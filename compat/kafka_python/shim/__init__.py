# Makes the sdist's `test/` a regular package, so `from test.testutil import ...` finds it and not the
# standard library's `test` package.
