"""kop's benchmarks: real `kop standalone` processes driven by real Kafka clients.

`python -m bench.run` runs the quick set (produce, consume, dedup overhead); `--full` adds the bigger runs and the
recovery benchmark. Each module also runs on its own (`python -m bench.produce --help`). Figures go into
BENCHMARKS.md together with the command that produced them.
"""
