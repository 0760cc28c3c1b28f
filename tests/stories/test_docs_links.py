"""Every relative link in README.md, docs/*.md and docs/derivations/*.md reaches an existing file, and its #anchor
a heading (or an explicit ``<a id>``) there; every repository path the docs and the shipped code's text name
(``docs/decisions.md``, ``examples/...``) exists; every citation of a derivation in code, tests and docs
(``docs/derivations/baselines.md#fft-noise-margin``, several anchors of a page as ``page.md#a, #b and #c``) names an
existing page and anchor, and none cites docs/decisions.md by a section number (its sections became pages).

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

PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "derivations").glob("*.md")),
]

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


# Where code, tests and docs cite derivations: TEXTS and the test and tool sources.
CITING = [
    *TEXTS,
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "scripts").rglob("*.py")),
    *sorted((ROOT / "benchmarks").rglob("*.py")),
]
CITING = [p for p in CITING if p.name != Path(__file__).name]  # this file's examples are cited on purpose
# docs/derivations/baselines.md#fft-noise-margin, docs/derivations/glm.md#glm-binary, #glm-softmax and #glm-routes
_CITATION = re.compile(r"docs/((?:derivations/)?[\w-]+\.md)#([\w-]+)((?:(?:, and |, | and )#[\w-]+)*)")
# the old numbered sections: "docs/derivations/baselines.md#skip-pld-rows",
# "docs/derivations/baselines.md#fft-noise-margin", "docs/derivations/assumptions.md#gradient-step-audit"
_BY_NUMBER = re.compile(
    r"decisions(?:\.md)?(?:'s)?[,:]?[\s#:]*\(?\s*(?:sections?[\s#:]*)?\d"
    r"|sections?\s+\d+(?:[,.]\s*(?:parts?\s*)?\d+)?\s+of\s+(?:the\s+)?(?:docs/)?decisions",
    re.I,
)
# "docs/derivations/schedule-mixtures.md#schedule-mixtures" alone, which meant docs/decisions.md (no paper or spec
# section that high is cited); "old docs/derivations/schedule-mixtures.md#schedule-mixtures"
# (the decision log's record of the old numbers) and "BOUNDS.md section 9" (the spec) are not citations of it
_BARE_SECTION = re.compile(r"(?<![\w/#.-])(?<!old )(?<!BOUNDS\.md )[Ss]ections?\s+(?:9|1\d|2[0-6])(?![\d.]\d)")


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


def broken_citations(text: str) -> list[str]:
    """The derivation citations in ``text`` whose page or anchor does not exist."""
    broken = []
    for page, first, more in _CITATION.findall(text):
        file = ROOT / "docs" / page
        if not file.exists():
            broken.append(f"docs/{page}: no such file")
            continue
        for anchor in [first, *re.findall(r"#([\w-]+)", more)]:
            if anchor not in anchors(file):
                broken.append(f"docs/{page}#{anchor}: no such anchor")
    return broken


def citations_by_number(text: str) -> list[str]:
    """Citations of docs/decisions.md by a section number (stale since its sections became pages)."""
    return [m.group(0) for m in _BY_NUMBER.finditer(text)] + [m.group(0) for m in _BARE_SECTION.finditer(text)]


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
    assert "proof-status" in anchors(ROOT / "docs" / "derivations" / "provenance.md")  # an explicit <a id>
    assert "the-log" in anchors(ROOT / "docs" / "decisions.md")


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


def test_broken_citations_and_numbered_ones_are_reported():
    text = (
        "ok docs/derivations/baselines.md#fft-noise-margin; ok docs/derivations/glm.md#glm-binary, #glm-softmax and"
        " #glm-routes; gone docs/derivations/glm.md#nope and docs/derivations/nowhere.md#x; log docs/decisions.md#the-log"
    )
    assert broken_citations(text) == [
        "docs/derivations/glm.md#nope: no such anchor",
        "docs/derivations/nowhere.md: no such file",
    ]
    by_number = [
        "(docs/decisions.md, section 18 part 5)",
        "(decisions 18.7)",
        "(decisions.md 22, part 5)",
        "docs/decisions.md,\n    # section 15, part 6",
        "(section 9 of decisions.md)",
        "[decisions.md, section 17](decisions.md#17-schedule-mixtures)",
        "(section 17, part 6)",
        "Section 25's estimate",
    ]
    not_by_number = [
        "old section 17",
        "BOUNDS.md section 9",
        "Bok, Su & Altschuler 2024, section 4",
        "see docs/decisions.md and docs/derivations/glm.md#glm-route",
        "Lemmas 20-21 (decisions about the 2 cases)",
    ]
    assert [t for t in by_number if not citations_by_number(t)] == []
    assert [t for t in not_by_number if citations_by_number(t)] == []


@pytest.mark.parametrize("text", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_derivation_cited_exists_and_none_by_number(text):
    content = text.read_text(encoding="utf-8")
    broken = broken_citations(content)
    assert not broken, f"{text.relative_to(ROOT)} cites what does not exist: {broken}"
    numbered = citations_by_number(content)
    assert not numbered, f"{text.relative_to(ROOT)} cites docs/decisions.md by number: {numbered}"
