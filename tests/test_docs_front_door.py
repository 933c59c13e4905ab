"""The README is a front door in the ecosystem's shape and the docs hold the rest: at most 200 lines, one table of the
four methods (unit, release, docs page, tiny and full config, each of which exists), every docs page reachable from
it, every relative link and anchor of the README and docs resolving, and no internal issue numbers anywhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
METHODS = {  # docs page → (tiny config, full config)
    "docs/relational.md": ("configs/tiny.yaml", "configs/relational.yaml"),
    "docs/dp_gcn.md": ("configs/dp_gcn_tiny.yaml", "configs/dp_gcn.yaml"),
    "docs/advsgm.md": ("configs/advsgm_tiny.yaml", "configs/advsgm.yaml"),
    "docs/dp_gpl.md": ("configs/dp_gpl_tiny.yaml", "configs/dp_gpl.yaml"),
}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(1) for m in LINK.finditer(text) if not re.match(r"[a-z]+://|mailto:", m.group(1))]


def test_the_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_has_one_methods_table_with_a_page_a_tiny_and_a_full_config_per_method():
    rows = [line for line in README.read_text().splitlines() if line.startswith("| [")]
    assert len(rows) == len(METHODS)
    for row, (page, configs) in zip(rows, METHODS.items()):
        assert f"]({page})" in row and all(f"`{c}`" in row for c in configs), row
        assert (ROOT / page).is_file() and all((ROOT / c).is_file() for c in configs)
    assert "which method should i pick" in README.read_text().lower()


def test_every_docs_page_is_reachable_from_the_readme():
    linked = {(ROOT / link.split("#")[0]).resolve() for link in _links(README)}
    missing = [p.name for p in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"] if p.resolve() not in linked]
    assert not missing, f"not linked from the README: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_relative_link_and_anchor_resolves(path):
    broken = []
    for link in _links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(link)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(link)
    assert not broken, broken


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_no_internal_issue_numbers(path):
    found = re.findall(r"(?i)\bissues?\s*#?\d+|#\d{1,3}\b", re.sub(r"```.*?```", "", path.read_text(), flags=re.S))
    assert not found, found


def test_the_checks_catch_what_they_look_for(tmp_path):
    assert _slug("ε at the relational paper's Section 5.1 defaults") == "ε-at-the-relational-papers-section-51-defaults"
    assert _slug("The contract a custom module or datamodule follows") == "the-contract-a-custom-module-or-datamodule-follows"
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\nSee [x](missing.md), [y](#title), [z](https://example.org) and ![img](a.png).\n")
    assert _links(doc) == ["missing.md", "#title"] and _anchors(doc) == {"title"}
    assert re.findall(r"(?i)\bissues?\s*#?\d+", "as in issue 24's recipe") == ["issue 24"]
