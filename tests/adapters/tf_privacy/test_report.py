"""lastiter_plugins/adapters/tf_privacy/_report.py and the statement: the valid number beside what TF Privacy's
compute_dp_sgd_privacy_statement prints for the run, marked NOT VALID where its assumptions fail, with the ratio;
the statement without a learning rate or with an update other than SGD."""

from __future__ import annotations

import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfp_privacy = pytest.importorskip("tensorflow_privacy")

from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins import host  # noqa: E402
from lastiter_plugins.adapters.tf_privacy import LastIterateCallback, compute_last_iterate_privacy_statement  # noqa: E402
from tests.support import quiet_single_threaded  # noqa: E402

quiet_single_threaded(tf)
DELTA = 1e-5


def printed(n, b, epochs, z):
    """The two example-level numbers TF Privacy's statement prints (used_microbatching=False)."""
    text = compute_dp_sgd_privacy_lib.compute_dp_sgd_privacy_statement(
        number_of_examples=n, batch_size=b, num_epochs=epochs, noise_multiplier=z, delta=DELTA,
        used_microbatching=False,
    )  # fmt: skip
    once = float(re.search(r"once per epoch:\s+([\d.]+)", text).group(1))
    poisson = float(re.search(r"Poisson sampling \(\*\):\s+([\d.]+)", text).group(1))
    return once, poisson


@pytest.mark.parametrize(
    ("n", "b", "steps", "z"), [(1000, 50, 60, 1.0), (64, 16, 8, 1.3), (50000, 4096, 2468, 3.0), (100, 30, 8, 1.1)]
)
def test_the_host_numbers_are_what_tf_privacy_prints(n, b, steps, z):
    config = lp.TrainingConfig(dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps, sampling="reshuffle")
    numbers = {h.id: h for h in host.host_numbers(config, DELTA, "tf_privacy")}
    once, poisson = printed(n, b, steps / config.steps_per_epoch, z)
    assert numbers["tf-privacy-epochs"].epsilon == pytest.approx(once, abs=5e-4)
    assert numbers["tf-privacy-poisson"].epsilon == pytest.approx(poisson, abs=5e-4)


def test_the_callback_logs_and_report_show_tf_privacys_number_not_valid_with_the_ratio():
    n, b = 64, 16
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])  # fmt: skip
    model.compile(
        optimizer=tfp_privacy.DPKerasAdamOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.01),
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
    )
    cb = LastIterateCallback(sampling="reshuffle", dataset_size=n, delta=DELTA)
    history = model.fit(x, y, batch_size=b, epochs=2, callbacks=[cb], verbose=0).history
    poisson = [printed(n, b, epochs, 1.0)[1] for epochs in (1, 2)]
    assert history["tf_privacy_epsilon_not_valid"] == pytest.approx(poisson, abs=5e-4)
    assert "tf_privacy_epsilon" not in history  # never valid for fit, which does not sample Poisson batches
    ratios = [e / p for e, p in zip(history["epsilon"], history["tf_privacy_epsilon_not_valid"], strict=True)]
    assert history["epsilon_over_tf_privacy"] == pytest.approx(ratios, rel=1e-12)
    assert all(r > 1 for r in ratios)  # the valid number is larger: TF Privacy's is below the truth for fit
    text = str(cb.report)
    # the answer first (issue 41): the number, what it protects, its relation, the winner and its provenance,
    # TF Privacy's numbers NOT VALID, within the first lines
    assert text.startswith(f"epsilon = {cb.epsilon:.4g} at delta = 1e-05 for every iterate; replace_one neighbours")
    first = "\n".join(cb.report.answer)
    assert "reshuffle sampling" in first and "From composition-gdp-epochs: published (" in first
    assert "Host libraries: NOT VALID here: tf-privacy-" in first and len(cb.report.answer) <= 8
    assert "sampling reshuffle" in text and max(map(len, text.split("\n"))) <= 120
    text = " ".join(text.split())  # (lines wrapped at 120 characters)
    assert re.search(r"TF Privacy statement, Poisson: epsilon = [\d.]+ .* NOT VALID: it assumes poisson sampling", text)
    assert f"the valid epsilon is {ratios[-1]:.3g}x it" in text
    assert "left best: kong-ribero-curvature-free left at step 1: the optimizer is DPKerasAdamOptimizer" in text


STATEMENT = dict(number_of_examples=1000, batch_size=50, num_epochs=3, noise_multiplier=1.0, delta=DELTA,
                 l2_norm_clip=1.0)  # fmt: skip


def test_the_statement_without_a_learning_rate_names_the_rows_that_need_it():
    text = compute_last_iterate_privacy_statement(
        **STATEMENT, sampling="cyclic", smoothness=0.25, gradient_norms_within_clip=True
    )
    flat = " ".join(text.split())
    assert "constant learning rate not given" in flat
    need = host.rows_needing(
        "learning_rate",
        lp.TrainingConfig(dataset_size=1000, batch_size=50, noise_multiplier=1.0, steps=60, sampling="cyclic"),
        lp.LossAssumptions(smoothness=0.25, gradient_norms_within_clip=True),
    )
    assert need and f"give learning_rate= for {', '.join(need)}" in flat
    given = compute_last_iterate_privacy_statement(
        **STATEMENT, sampling="cyclic", learning_rate=0.5, smoothness=0.25, gradient_norms_within_clip=True
    )
    assert "give learning_rate=" not in given and any(bid in given for bid in need)


def test_the_statement_of_an_update_other_than_sgd_says_it_protects_every_iterate():
    text = compute_last_iterate_privacy_statement(**STATEMENT, sampling="reshuffle", update="any")
    flat = " ".join(text.split())
    valid = lp.epsilon("best", DELTA, dataset_size=1000, batch_size=50, noise_multiplier=1.0, epochs=3,
                       sampling="reshuffle", update="any")  # fmt: skip
    assert f"best {valid.epsilon:.3f}" in " ".join(flat.split()) and valid.winner in flat
    assert "No bound certifying the final model alone applies to this pipeline" in flat
    _, poisson = printed(1000, 50, 3.0, 1.0)
    assert f"Poisson: epsilon = {poisson:.4g} (add_or_remove_one, every iterate) NOT VALID" in flat
    assert f"the valid best above (replace_one) is {valid.epsilon / poisson:.3g}x it" in flat
    assert "each example once per epoch" in flat and "not proven for a fixed batch size" in flat
    with pytest.raises(ValueError, match=r"update must be one of sgd, any"):
        compute_last_iterate_privacy_statement(**STATEMENT, sampling="reshuffle", update="adam")


def test_the_cnn_example_prints_the_valid_number_beside_tf_privacys(capsys):
    """examples/tf_privacy_cnn.py: a CNN with DP Adam on a shuffled tf.data pipeline gets the every-iterate
    number of its sampler, and TF Privacy's Poisson number beside it, NOT VALID, several times smaller."""
    import importlib.util

    from tests.support import ROOT

    pytest.importorskip("sklearn")
    spec = importlib.util.spec_from_file_location("tf_privacy_cnn", ROOT / "examples" / "tf_privacy_cnn.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    accountant = example.main(["--epochs", "1"])
    out = capsys.readouterr().out
    expected = lp.epsilon("best", DELTA, dataset_size=1792, batch_size=64, noise_multiplier=1.0, epochs=1,
                          sampling="reshuffle", update="any")  # fmt: skip
    assert accountant.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-05 for every iterate" in out
    _, poisson = printed(1792, 64, 1.0, 1.0)
    assert f"TF Privacy statement, Poisson: epsilon = {poisson:.4g}" in out and "NOT VALID" in out
    assert accountant.epsilon > 2 * poisson


def test_the_readme_and_the_guide_quote_the_cnn_examples_numbers():
    from tests.support import ROOT

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    guide = (ROOT / "docs" / "tf_privacy.md").read_text(encoding="utf-8")
    epochs = 3  # the example's default
    valid = lp.epsilon(
        "best", DELTA, dataset_size=1792, batch_size=64, noise_multiplier=1.0, epochs=epochs, sampling="reshuffle",
        update="any",
    )  # fmt: skip
    _, poisson = printed(1792, 64, float(epochs), 1.0)
    quoted = f"gets {valid.epsilon:.4g} (every iterate, replace-one) where TF Privacy's statement prints {poisson:.4g}"
    assert quoted in readme
    assert f"epsilon = {valid.epsilon:.4g} at delta = 1e-05 for every iterate" in guide  # the answer first
    assert f"TF Privacy statement, Poisson: epsilon = {poisson:.4g}" in guide
    assert f"the valid epsilon is {valid.epsilon / poisson:.3g}x it" in guide


def test_the_statement_describes_every_sampling():
    for sampling in lp.Sampling:
        try:
            text = compute_last_iterate_privacy_statement(**STATEMENT, sampling=sampling, learning_rate=0.5)
        except ValueError as exc:  # no row for this sampling under either relation: said so, not a KeyError
            assert "no bound applies" in str(exc)
            continue
        assert "Sampling: " in text
