"""README.md's "What a deep network gets": examples/opacus_cnn.py runs, and its output is the README's."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.support import ROOT

pytest.importorskip("opacus")
pytest.importorskip("sklearn")


def _readme_output() -> list[str]:
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## What a deep network gets", 1)[1]
    blocks = re.findall(r"```text\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    return blocks[1].rstrip("\n").split("\n")  # (the first block is the excerpt of the code)


def test_the_cnn_example_prints_what_the_readme_shows(capsys):
    import torch

    spec = importlib.util.spec_from_file_location("opacus_cnn", ROOT / "examples" / "opacus_cnn.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.set_num_threads(1)
    result = example.main()
    printed = capsys.readouterr().out.rstrip("\n").split("\n")
    shown = _readme_output()
    assert printed[:-1] == shown[:-1]  # every number and line but the accuracy: exactly the README's
    assert re.fullmatch(r"test accuracy 0\.\d\d \(297 held-out digits\)", printed[-1])
    assert abs(result["accuracy"] - float(shown[-1].split()[2])) <= 0.03  # (float summation order aside)
    assert result["winner"] == "composition-gdp-epochs" and any("NOT VALID" in line for line in printed)
