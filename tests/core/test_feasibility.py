"""lastiter_plugins/feasibility.py: declarations no loss meets, warned first by the API and the CLI (issue 41)."""

from __future__ import annotations

import warnings

import pytest

import lastiter_plugins as lp
from lastiter_plugins.cli import main
from lastiter_plugins.lower_end import lower_bound
from tests.support import cli_flags, strongly_convex

#: The README's example of 0.2 (and issue 41's): strongly convex, every gradient within the clip, no projection.
README_SET = dict(
    dataset_size=60000, batch_size=256, noise_multiplier=1.1, learning_rate=0.05, epochs=10, sampling="shuffle_once",
    smoothness=0.25, strong_convexity=1e-3, gradient_norms_within_clip=True,
)  # fmt: skip


@pytest.mark.parametrize(
    ("declared", "impossible"),
    [
        (dict(strong_convexity=0.1, gradient_norms_within_clip=True), True),
        (dict(strong_convexity=0.1, clipped_loss_convex_smooth=True), True),
        (dict(strong_convexity=0.1, gradient_norms_within_clip=True, diameter=30.0), True),  # lam D / 2 = 1.5 > C
        (dict(strong_convexity=0.1, gradient_norms_within_clip=True, diameter=20.0), False),  # lam D / 2 = C
        (dict(strong_convexity=0.1, gradient_norms_within_clip=True, l2_outside_clip=True), False),
        (dict(strong_convexity=0.1, gradient_norms_within_clip=False), False),  # clipping may act: no gradient step
        (dict(strong_convexity=0.0, gradient_norms_within_clip=True), False),
    ],
    ids=["within-clip", "linear-route", "domain-too-wide", "domain-just-fits", "l2-outside", "clipped", "convex"],
)
def test_which_declarations_no_loss_meets(declared, impossible):
    config, assumptions = lp.build(**strongly_convex(**declared))
    why = lp.impossible_declaration(config, assumptions)
    assert (why is not None) is impossible
    if impossible:
        assert why.startswith("no loss meets these declarations") and "strong_convexity" in why
        # the lower end uses the same definition: no instance, and the same words
        assert lower_bound(config, assumptions, 1e-5).note == why


def test_a_strong_convexity_above_the_smoothness_is_refused_when_declared():
    with pytest.raises(ValueError, match="strong_convexity must be <= smoothness"):
        lp.LossAssumptions(smoothness=0.1, strong_convexity=0.2)


def test_the_api_warns_before_any_number():
    with pytest.warns(lp.ImpossibleDeclarationWarning, match="no loss meets these declarations"):
        lp.epsilon("best", 1e-5, **README_SET)
    with pytest.warns(lp.ImpossibleDeclarationWarning):
        lp.applicable_bounds(**README_SET)
    with warnings.catch_warnings():
        warnings.simplefilter("error", lp.ImpossibleDeclarationWarning)  # a possible set: silent
        lp.epsilon("best", 1e-5, **{**README_SET, "diameter": 10.0})
        lp.epsilon("best", 1e-5, **{**README_SET, "l2_outside_clip": True})


@pytest.mark.parametrize("command", ["epsilon", "compare", "bounds"])
def test_the_cli_leads_with_the_warning(capsys, command):
    code = main([command, *cli_flags(README_SET)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("WARNING: no loss meets these declarations"), out[:300]
    assert "no loss meets" not in err  # said once, first, not in a side line


def test_json_keeps_the_warning_on_stderr(capsys):
    code = main(["epsilon", *cli_flags(README_SET), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("{") and "no loss meets these declarations" in err
