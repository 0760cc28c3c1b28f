"""Every relative link in README.md and docs/*.md reaches an existing file, and its #anchor a heading there;
every repository path the docs and the shipped code's text name (``docs/decisions.md``, ``examples/...``) exists.

Anchors are GitHub's: the heading text lower-cased, punctuation dropped (letters, digits, spaces,
hyphens and underscores kept), spaces made hyphens, a repeated heading suffixed -1, -2, ...
Links inside code (fenced blocks, inline code) are not links and are skipped.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
# A path from the repository root named in running text: `docs/bounds.md`, examples/scenarios/*.toml, ...
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|examples|adapters|lastiter_plugins|tests|benchmarks|scripts|constraints)/[\w./*-]*[\w/*])"
)
# The text users read: the docs, the changelog, and the docstrings and messages of what is shipped or run;
# and the scripts that run the tests.
TEXTS = [
    *PAGES,
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "lastiter_plugins").rglob("*.py")),
    *sorted((ROOT / "adapters").rglob("*.py")),
    *sorted((ROOT / "examples").rglob("*.py")),
    *sorted((ROOT / "examples").rglob("*.toml")),
    ROOT / "tests" / "README.md",
    *sorted((ROOT / "scripts").glob("*.sh")),  # their test selections name files that moved once
    ROOT / ".ci" / "run",
]


def _prose(text: str) -> str:
    """``text`` without code: fenced blocks and inline code spans blanked."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    out: set[str] = set(_HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, heading in _HEADING.findall(text):
        slug = github_anchor(heading)
        count = seen.get(slug, 0)
        out.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return out


def relative_links(path: Path) -> list[str]:
    links = _LINK.findall(_prose(path.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I)]  # http:, mailto:, ...


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or #anchor does not exist."""
    broken = []
    for link in relative_links(page):
        target, _, anchor = unquote(link).partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(f"{link}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link}: no heading with anchor #{anchor} in {file.name}")
    return broken


def missing_paths(text: str) -> list[str]:
    """The repository paths named in ``text`` that do not exist (a glob must match something)."""
    missing = []
    for path in _REPO_PATH.findall(text):
        path = path.rstrip(".")
        if not (glob.glob(str(ROOT / path)) if "*" in path else (ROOT / path).exists()):
            missing.append(path)
    return missing


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("8. Proof status is data; altschuler-talwar is unproven", "8-proof-status-is-data-altschuler-talwar-is-unproven"),
        ("15. Certified linear models (the GLM route)", "15-certified-linear-models-the-glm-route"),
        ("`register`", "register"),
        ("Feature clipping a -> a min(1, A'/|a|) in floating point", "feature-clipping-a---a-min1-aa-in-floating-point"),
    ],
    ids=["punctuation", "parentheses", "code", "symbols"],
)  # fmt: skip
def test_github_anchor_known_values(heading, anchor):
    assert github_anchor(heading) == anchor


def test_the_walk_finds_links_and_anchors():
    readme = relative_links(ROOT / "README.md")
    assert "docs/index.md" in readme and any("#" in link for link in readme)
    assert "8-proof-status-is-data-altschuler-talwar-is-unproven" in anchors(ROOT / "docs" / "decisions.md")


def test_broken_links_and_stale_paths_are_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Known `section`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n[ok](other.md) [ok](other.md#known-section) [ok](#top) [web](https://example.org/x.md)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad](#nowhere) `[code](not-a-link.md)`\n"
        "```\n[fenced](not-a-link-either.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nope: no heading with anchor #nope in other.md",
        "#nowhere: no heading with anchor #nowhere in page.md",
    ]
    text = "see docs/decisions.md, examples/scenarios/*.toml and (docs/_drafts/glm.md), or docs/nope/*.md."
    assert missing_paths(text) == ["docs/_drafts/glm.md", "docs/nope/*.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("text", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(text):
    missing = missing_paths(text.read_text(encoding="utf-8"))
    assert not missing, f"{text.relative_to(ROOT)} names paths that do not exist: {missing}"
