"""lp.advise: single changes that lower best, each evaluated by the one evaluation path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lastiter_plugins as lp

RESHUFFLE_LR_TOO_LARGE = dict(
    sampling="reshuffle",
    dataset_size=60_000,
    batch_size=1500,
    noise_multiplier=3.0,
    learning_rate=3.0,  # above 2/M: no last-iterate bound applies
    epochs=100,
    smoothness=1.0,
    strong_convexity=0.5,
    gradient_norms_within_clip=True,
)


def test_advice_lowers_best_and_says_how():
    current = lp.epsilon("best", 1e-5, **RESHUFFLE_LR_TOO_LARGE)
    assert lp.is_standard_baseline(current)
    advice = lp.advise(1e-5, **RESHUFFLE_LR_TOO_LARGE)
    assert advice, "a smaller step size opens the reshuffle bound"
    assert [s.epsilon for s in advice] == sorted(s.epsilon for s in advice)
    first = advice[0]
    assert first.parameters == {"learning_rate": 1.5} and first.changes_training
    assert first.winner == "shifted-interpolation-reshuffle" and first.epsilon < current.epsilon / 10
    for s in advice:  # each number is what the API gives for the changed pipeline, in the same relation
        again = lp.epsilon("best", 1e-5, **{**RESHUFFLE_LR_TOO_LARGE, **s.parameters})
        assert s.epsilon == again.epsilon and s.winner == again.winner
        assert s.result.relation is current.relation and s.epsilon < current.epsilon
        assert str(s.epsilon)[:3] in str(s) and ("changes training" in str(s)) == s.changes_training
    assert len(lp.advise(1e-5, top=1, **RESHUFFLE_LR_TOO_LARGE)) == 1


def test_a_declaration_alone_is_marked_accounting_only():
    params = dict(
        sampling="cyclic",
        dataset_size=10_000,
        batch_size=100,
        noise_multiplier=2.0,
        learning_rate=1.0,
        epochs=50,
        smoothness=0.26,
        strong_convexity=0.01,
    )
    advice = {tuple(s.parameters): s for s in lp.advise(1e-5, **params)}
    declare = advice[("gradient_norms_within_clip",)]
    assert not declare.changes_training and declare.winner == "shifted-interpolation-cyclic"


def test_poisson_under_add_or_remove_gets_no_sampler_change():
    params = dict(
        sampling="poisson",
        relation="add_or_remove_one",
        dataset_size=10_000,
        batch_size=100,
        noise_multiplier=1.0,
        epochs=5,
    )
    for s in lp.advise(1e-5, **params):
        assert "sampling" not in s.parameters and s.result.relation is lp.Relation.ADD_OR_REMOVE_ONE


def test_the_pipeline_itself_is_validated():
    with pytest.raises(ValueError):
        lp.advise(1e-5, **{**RESHUFFLE_LR_TOO_LARGE, "batch_size": 0})


# ---------------------------------------------------------------- the CLI (the installed console script)

LASTITER = Path(sys.executable).with_name("lastiter")


def _flags(learning_rate: str = "3") -> list[str]:
    """RESHUFFLE_LR_TOO_LARGE as command-line flags."""
    return [
        "--sampling", "reshuffle", "--dataset-size", "60000", "--batch-size", "1500", "--noise-multiplier", "3",
        "--learning-rate", learning_rate, "--epochs", "100", "--smoothness", "1", "--strong-convexity", "0.5",
        "--gradient-norms-within-clip", "--delta", "1e-5",
    ]  # fmt: skip


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(LASTITER), *argv], capture_output=True, text=True, check=False)


def test_lastiter_advise_json_is_the_api():
    proc = _run("advise", *_flags(), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    api = lp.advise(1e-5, **RESHUFFLE_LR_TOO_LARGE)
    assert [row["epsilon"] for row in data["suggestions"]] == [s.epsilon for s in api]
    assert data["suggestions"][0]["parameters"] == {"learning_rate": 1.5}
    assert data["best"]["winner"] == lp.epsilon("best", 1e-5, **RESHUFFLE_LR_TOO_LARGE).winner


def test_lastiter_epsilon_says_when_best_is_a_standard_baseline():
    proc = _run("epsilon", "--bound", "best", *_flags())
    assert proc.returncode == 0, proc.stderr
    assert "standard baseline" in proc.stdout and "lower the learning rate to 1.5" in proc.stdout
    shifted = _run("epsilon", "--bound", "best", *_flags(learning_rate="1.5"))
    assert shifted.returncode == 0, shifted.stderr
    assert "shifted-interpolation-reshuffle" in shifted.stdout and "standard baseline" not in shifted.stdout


# ---------------------------------------------------------------- the adapters' reports say it too


def test_opacus_report_says_when_best_is_a_standard_baseline():
    pytest.importorskip("opacus")
    from lastiter_plugins.adapters.opacus import _report

    config, assumptions = lp.build(**RESHUFFLE_LR_TOO_LARGE)
    report = _report.build_report("last-iterate", config, assumptions, 1e-5, None)
    assert "This is a standard baseline (composition" in str(report) and "lower the learning rate to 1.5" in str(report)
    assert report.to_dict()["advice"] == report.advice
    fine = _report.build_report(
        "last-iterate", *lp.build(**{**RESHUFFLE_LR_TOO_LARGE, "learning_rate": 1.5}), 1e-5, None
    )
    assert fine.advice == "" and "This is a standard baseline" not in str(fine)


def test_keras_statement_says_when_best_is_a_standard_baseline():
    pytest.importorskip("tensorflow_privacy")
    from lastiter_plugins.adapters.tf_privacy import compute_last_iterate_privacy_statement

    common = dict(
        number_of_examples=60_000,
        batch_size=1500,
        num_epochs=100,
        noise_multiplier=3.0,
        l2_norm_clip=1.0,
        delta=1e-5,
        sampling="reshuffle",
        smoothness=1.0,
        strong_convexity=0.5,
        gradient_norms_within_clip=True,
    )
    text = " ".join(compute_last_iterate_privacy_statement(learning_rate=3.0, **common).split())
    assert "This is a standard baseline (composition" in text and "lower the learning rate to 1.5" in text
    fine = " ".join(compute_last_iterate_privacy_statement(learning_rate=1.5, **common).split())
    assert "This is a standard baseline" not in fine and "shifted-interpolation-reshuffle" in fine
