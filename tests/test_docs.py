"""The documentation stays true to the code and inside the repository: the generated reference sections of docs/
match what kop.reference renders now, every configuration key says what it does, and every link in a tracked
Markdown file points at a file of the repository (and, with an anchor, at one of its headings)."""
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from kop import reference
from kop.config import BrokerConfig
from kop.config_file import KAFKA_KEYS

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def test_generated_sections_are_current():
    for document in {where for where, _generate in reference.SECTIONS.values()}:
        text = (ROOT / "docs" / document).read_text(encoding="utf-8")
        assert reference.render(document, text) == text, \
            f"docs/{document} is stale: run python -m kop.reference --write"


def test_render_replaces_a_stale_section_and_refuses_missing_markers():
    begin, end = reference._markers("apis")
    fresh = reference.render("compatibility.md", f"intro\n{begin}\nold table\n{end}\noutro\n")
    assert "old table" not in fresh and "| Produce | 0 |" in fresh and fresh.endswith(f"{end}\noutro\n")
    try:
        reference.render("compatibility.md", "no markers here")
    except ValueError as exc:
        assert "apis" in str(exc)
    else:
        raise AssertionError("a document without its markers was accepted")


def test_every_configuration_key_says_what_it_does():
    undocumented = [f.name for f in fields(BrokerConfig) if not f.metadata["doc"].strip()]
    undocumented += [key for key, spec in KAFKA_KEYS.items() if not spec.doc.strip()]
    assert undocumented == []


def github_anchor(heading: str, seen: dict[str, int]) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return f"{slug}-{count}" if count else slug


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {github_anchor(h, seen) for h in HEADING.findall(text)}


def link_problems(path: Path) -> list[str]:
    problems = []
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        where = f"{path.relative_to(ROOT)}: ({target})"
        file_part, _, anchor = target.partition("#")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith(("/", "//")):
            problems.append(f"{where} leaves the repository")
            continue
        linked = (path.parent / file_part).resolve() if file_part else path
        if ROOT not in linked.parents and linked != ROOT:
            problems.append(f"{where} leaves the repository")
        elif not linked.exists():
            problems.append(f"{where} names a missing file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where} names a missing heading")
    return problems


def tracked_markdown() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in listed.stdout.splitlines()]


def test_markdown_links_stay_inside_the_repository_and_resolve():
    files = tracked_markdown()
    assert ROOT / "README.md" in files
    assert [p for f in files for p in link_problems(f)] == []


def test_the_link_check_finds_what_it_must(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title here\n## The `x`: rules\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#the-x-rules) [ok](#top) [up](../shared/DESIGN.md) [web](https://example.com)\n"
                    "[gone](docs/missing.md) [bad anchor](docs/a.md#nope)\n```\n[in code](../x.md)\n```\n# Top\n",
                    encoding="utf-8")
    problems = link_problems(page)
    assert problems == ["README.md: (../shared/DESIGN.md) leaves the repository",
                        "README.md: (https://example.com) leaves the repository",
                        "README.md: (docs/missing.md) names a missing file",
                        "README.md: (docs/a.md#nope) names a missing heading"]
