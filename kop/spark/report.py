"""An audit as files: a JSON report and a PNG chart (per producer name: expected, stored, duplicates, missing; per
partition: records and holes)."""
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from kop.spark.audit import AuditReport  # noqa: E402

MAX_NAMES_CHARTED = 30


def write_json(report: AuditReport, path: str) -> None:
    with open(path, "w") as out:
        json.dump(report.as_dict(), out, indent=2)
        out.write("\n")


def write_chart(report: AuditReport, path: str, title: str = "") -> None:
    figure, (by_name, by_partition) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 1]})
    verdict = "exactly once" if report.exactly_once else (
        f"{report.duplicates} duplicates, {report.missing} missing")
    figure.suptitle(f"{title or report.topic}: {report.stored} stored of {report.expected} expected, {verdict}")
    _bars(by_name, [n.producer_name for n in report.names[:MAX_NAMES_CHARTED]], {
        "expected": [n.expected for n in report.names[:MAX_NAMES_CHARTED]],
        "stored": [n.stored for n in report.names[:MAX_NAMES_CHARTED]],
        "duplicates": [n.duplicates for n in report.names[:MAX_NAMES_CHARTED]],
        "missing": [n.missing for n in report.names[:MAX_NAMES_CHARTED]],
    })
    by_name.set_title("per producer name" if report.names else
                      f"no sequence-id headers ({report.without_sequence_ids} records)")
    _bars(by_partition, [str(p.partition) for p in report.partitions], {
        "records": [p.records for p in report.partitions],
        "holes (duplicates dropped)": [p.holes for p in report.partitions],
    })
    by_partition.set_title("per partition")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _bars(axes, labels: list[str], series: dict[str, list[int]]) -> None:
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        axes.bar([x + i * width for x in range(len(labels))], values, width, label=label)
    axes.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=45, ha="right", fontsize=7)
    axes.legend(fontsize=8)
