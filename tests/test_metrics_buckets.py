"""The hot path's plain histogram counts expose exactly what prometheus-client's own Histogram would."""
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from kop.admin.metrics import FSYNC_BUCKETS, LATENCY_BUCKETS, Buckets


class _One(Collector):
    def __init__(self, buckets: Buckets) -> None:
        self.buckets = buckets

    def collect(self):
        family = HistogramMetricFamily("h", "doc", labels=["api"])
        family.add_metric(["Produce"], *self.buckets.samples())
        yield family


def _exposition(bounds, values) -> tuple[bytes, bytes]:
    reference_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("h", "doc", ["api"], buckets=bounds, registry=reference_registry).labels("Produce")
    ours = Buckets(bounds)
    ours_registry.register(_One(ours))
    for value in values:
        reference.observe(value)
        ours.observe(value)
    return generate_latest(reference_registry), generate_latest(ours_registry)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 0.0001, 0.0005, 0.00051, 0.001, 1.0, 29.9, 30.0, 31.0, 1e9])
                       | st.floats(0, 100, allow_nan=False), max_size=30))
def test_buckets_expose_what_a_prometheus_histogram_exposes(values):
    for bounds in (LATENCY_BUCKETS, FSYNC_BUCKETS):
        reference, ours = _exposition(bounds, values)
        assert ours == reference  # kop.admin.metrics turns the `_created` series off for both


def test_a_value_on_a_bound_counts_in_that_bucket():
    buckets = Buckets((1, 2))
    buckets.observe(1)
    buckets.observe(2.5)
    assert buckets.samples() == ([("1.0", 1), ("2.0", 1), ("+Inf", 2)], 3.5)
