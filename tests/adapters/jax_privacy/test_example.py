"""examples/jax_privacy_keras.py runs, and every number it prints is the core's for the run it did."""

from __future__ import annotations

import importlib.util

import pytest

from tests.adapters.jax_privacy.support import NEEDS_JAX_PRIVACY
from tests.support import ROOT

pytest.importorskip("jax_privacy", reason=NEEDS_JAX_PRIVACY)

import lastiter_plugins as lp


def test_example_prints_the_valid_numbers_and_jax_privacys_beside_them(capsys):
    path = ROOT / "examples" / "jax_privacy_keras.py"
    spec = importlib.util.spec_from_file_location("jax_privacy_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    runs = example.main(["--epochs", "2"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    for name, sampling in (("shuffled", "reshuffle"), ("poisson", "poisson"), ("glm", "cyclic")):
        account = runs[name].account()
        expected = lp.epsilon("best", example.DELTA, config=account.config, assumptions=account.assumptions)
        assert account.config.sampling.value == sampling and account.config.steps == 2 * (example.N // example.BATCH)
        relation, protects = account.config.relation.value, expected.protects.value
        # the answer first (issue 41): the number, what it protects, its relation, its sampling
        assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-05 for {protects}; {relation} neighbours" in flat
        assert f"; {sampling} sampling." in flat
    assert runs["glm"].account().result.protects is lp.Protects.FINAL_MODEL
    assert runs["glm"].assumptions.clipped_loss_convex_smooth  # derived from the model, not declared
    own = [line for line in out.splitlines() if line.startswith("jax_privacy's own number") or "number for it" in line]
    # jax_privacy's own number NOT VALID: the shuffled run, its calibration, the fixed-order run (not Poisson)
    assert [("NOT VALID" in line) for line in own] == [True, True, False, True]
    assert runs["poisson"].host_number().valid is not False
