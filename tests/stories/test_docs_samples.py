"""The docs' code samples run (issue "One number on every route", item 6).

The self-contained pages (README.md, docs/api.md, docs/dp_accounting.md, docs/choosing.md) are run block by block,
in order, in one namespace per page, as a reader pasting them into one session would. The host guides
(docs/opacus.md, docs/tf_privacy.md) show fragments of a training loop that need your data and model;
their complete runs are the scripts of examples/, which tests/adapters/test_glm_adapters.py and the adapters'
tests run. The README's abridged compare output is checked against a real run in tests/core/test_cli.py.
"""

from __future__ import annotations

import re

import pytest

from tests.support import ROOT

SELF_CONTAINED = ("README.md", "docs/api.md", "docs/dp_accounting.md", "docs/choosing.md")
_PYTHON = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("page", SELF_CONTAINED)
def test_every_python_sample_of_a_self_contained_page_runs(page, capsys):
    blocks = _PYTHON.findall((ROOT / page).read_text(encoding="utf-8"))
    assert blocks, f"{page} has no python sample"
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{page} (python block {i + 1})", "exec"), namespace)
    capsys.readouterr()  # the samples print; what they print is not pinned here
