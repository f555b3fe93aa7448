"""Result tables: aligned text for the terminal, Markdown rows for BENCHMARKS.md."""
import math
from dataclasses import dataclass, field


def fmt(value: float, digits: int = 0) -> str:
    """A number for a table: thousands separated, NaN as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def text(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                       for i, (c, w) in enumerate(zip(cells, widths)))
        out = [self.title, line(self.columns), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows]
        out += [f"  {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        align = "|".join("---" if i == 0 else "---:" for i in range(len(self.columns)))  # numbers right-aligned
        out = [f"| {' | '.join(self.columns)} |", f"|{align}|"]
        out += [f"| {' | '.join(r)} |" for r in self.rows]
        return "\n".join(out)


def print_tables(tables: list[Table], markdown: bool) -> None:
    """A benchmark's tables on stdout, as text or as Markdown for BENCHMARKS.md, a blank line after each."""
    for t in tables:
        print(t.markdown() if markdown else t.text())
        print()
