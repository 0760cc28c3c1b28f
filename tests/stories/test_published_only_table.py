"""README.md's table of which wins survive ``--published-only`` (issue 41), generated from fresh runs.

The README holds the table between two markers; this test fails while it differs from what the examples give
now. ``python -m tests.stories.test_published_only_table`` rewrites it (from the repository root, in the test
environment), as ``python -m tests.stories.docs_blocks`` rewrites the output blocks.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import lastiter_plugins as lp
from lastiter_plugins import registry, scenarios
from tests.support import ROOT

BEGIN = "<!-- published-only table: python -m tests.stories.test_published_only_table -->"
END = "<!-- end of the published-only table -->"

#: The README's Python example (the pipeline of its "Python API" section).
README_EXAMPLE = dict(
    dataset_size=60_000, batch_size=600, noise_multiplier=1.0, epochs=20, learning_rate=0.5, smoothness=1.0,
    strong_convexity=0.05, diameter=10.0, gradient_norms_within_clip=True, sampling="shuffle_once",
)  # fmt: skip


def examples() -> list[tuple[str, dict, float]]:
    """(name, keyword parameters, delta): the built-in scenario, the README's Python example, the scenario files."""
    name, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
    out = [(f"`lastiter compare` ({name})", params, delta), ("README's Python example", README_EXAMPLE, 1e-5)]
    for path in sorted((ROOT / "examples" / "scenarios").glob("*.toml")):
        params_, delta_ = scenarios.split_scenario(scenarios.load_scenario(path))[1:]
        if params_ != params:  # the built-in scenario's file is listed once
            out.append((f"examples/scenarios/{path.name}", params_, delta_))
    return out


def table() -> str:
    """The Markdown table: each example's best, its proof, and best over published theorems only."""
    lines = [
        BEGIN,
        "| example | best | its proof | `--published-only` | the win survives |",
        "|---|---:|---|---:|---|",
    ]
    for name, params, delta in examples():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # a Poisson scenario without a relation
            best = lp.epsilon("best", delta, **params)
            try:
                published = lp.epsilon("best", delta, published_only=True, **params)
                only = f"{published.epsilon:.4g} ({published.winner})"
            except lp.NotApplicableError:
                published, only = None, "none applies"
        word = registry.provenance_word(best.provenance, best.proof.proven)
        survives = "yes" if published is not None and published.winner == best.winner else "no"
        lines.append(f"| {name} | {best.epsilon:.4g} ({best.winner}) | {word} | {only} | {survives} |")
    return "\n".join([*lines, END])


def _readme_table(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def test_the_readme_table_is_a_fresh_run():
    text = (ROOT / "README.md").read_text()
    fresh = table()
    assert _readme_table(text) == fresh, f"rewrite it: python -m tests.stories.test_published_only_table\n{fresh}"


def rewrite(readme: Path = ROOT / "README.md") -> None:
    text = readme.read_text()
    readme.write_text(text.replace(_readme_table(text), table()))


if __name__ == "__main__":
    rewrite()
    sys.exit(0)
