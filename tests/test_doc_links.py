"""Every relative link of README.md and docs/ reaches a file of the checkout, and every
#anchor a heading of it (GitHub's anchors: lower case, punctuation dropped, spaces to -)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link) and link != "#"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(
                f"{link} (no {path.relative_to(REPO) if path.is_relative_to(REPO) else path})"
            )
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link} (no heading #{anchor} in {path.name})")
    assert not broken, f"{page.name}: " + "; ".join(broken)
