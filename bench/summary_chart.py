"""The chart at the top of BENCHMARKS.md: its headline figures, read from bench/summary_figures.csv (each copied from
the table in BENCHMARKS.md that measured it), one panel per group.

    python -m bench.summary_chart                      # writes docs/img/benchmarks.png
    python -m bench.summary_chart --output other.png
"""
import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "bench" / "summary_figures.csv"
OUTPUT = ROOT / "docs" / "img" / "benchmarks.png"


def read_panels(path: Path) -> dict[str, list[tuple[str, float]]]:
    """Panel title -> its (bar label, value) pairs, in file order."""
    panels: dict[str, list[tuple[str, float]]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            panels.setdefault(row["panel"], []).append((row["label"], float(row["value"])))
    return panels


def _label(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.0f}k"
    return f"{value:,.0f}"


def draw(panels: dict[str, list[tuple[str, float]]], output: Path) -> None:
    columns = 2
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, (title, bars) in zip(axes.flat, panels.items()):
        labels, values = zip(*bars)
        drawn = ax.barh(labels, values, color="#3b75af")
        ax.bar_label(drawn, labels=[_label(v) for v in values], padding=3, fontsize=9)
        ax.invert_yaxis()  # first row on top, as in the file
        ax.set_title(title, fontsize=11, loc="left")
        ax.set_xlim(0, max(values) * 1.2)
        ax.xaxis.set_visible(False)
        ax.spines[["top", "right", "bottom"]].set_visible(False)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("kop on 2 cores, one broker, fsync on (details in BENCHMARKS.md)", fontsize=12)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figures", type=Path, default=FIGURES)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    draw(read_panels(args.figures), args.output)
    print(args.output)


if __name__ == "__main__":
    main()
