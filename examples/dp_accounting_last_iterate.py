"""Account a pipeline mixing a last-iterate DP-SGD run with standard mechanisms, in dp-accounting.

The pipeline, on one dataset of n = 1000 records, replace-one neighbours:
  1. release the mean of the (norm-clipped, C = 1) feature vectors with the
     Gaussian mechanism, noise std 8 on the sum;
  2. train a logistic regression with DP-SGD for 20 epochs over a fixed batch
     order, and release the FINAL model only. The features are scaled to norm
     <= 1, so every per-example loss is convex and 1/4-smooth, and its gradient
     (sigmoid(w.x) - y) x has norm <= 1 = C at every w: clipping is never
     active, which the run declares with gradient_norms_within_clip=True.

Standard accounting (every iterate released) versus the last-iterate
accountants: the RDP one (every bound), and the PLD one, which composes a run
certified mu-GDP (here by the shifted-interpolation f-DP bound) as the
dominating Gaussian mechanism with the feature mean in dp-accounting's PLD
accountant. Then the noise multiplier that meets a target epsilon, found with
dp-accounting's own calibrate_dp_mechanism. Accounting only: nothing is trained.

Run: python examples/dp_accounting_last_iterate.py
"""

from __future__ import annotations

import dp_accounting
from dp_accounting import dp_event

from lastiter_plugins.adapters.dp_accounting import (
    LastIterateAccountant,
    LastIterateDpSgdEvent,
    LastIteratePldAccountant,
)

N, BATCH, EPOCHS, NOISE, LR, DELTA = 1000, 50, 20, 4.0, 1.0, 1e-5
STEPS = EPOCHS * -(-N // BATCH)  # a pass is ceil(n / b) steps
REPLACE_ONE = dp_accounting.NeighboringRelation.REPLACE_ONE

# Step 1. Under replace-one, the clipped sum moves by up to 2C when one record
# is replaced; GaussianDpEvent takes noise / sensitivity: 8 / (2 * 1) = 4.
feature_mean = dp_event.GaussianDpEvent(8.0 / 2.0)


def training_run(noise_multiplier: float) -> LastIterateDpSgdEvent:
    """Step 2 as one event: a description of the run (the accountant chooses the bound)."""
    return LastIterateDpSgdEvent(
        sampling="cyclic",
        dataset_size=N,
        batch_size=BATCH,
        noise_multiplier=noise_multiplier,
        steps=STEPS,
        learning_rate=LR,
        smoothness=0.25,
        gradient_norms_within_clip=True,
    )


def main() -> None:
    # Standard accounting: each epoch uses every record once, so one epoch of
    # DP-SGD is one Gaussian mechanism of sensitivity 2C: GaussianDpEvent(z / 2).
    standard = dp_accounting.rdp.RdpAccountant(neighboring_relation=REPLACE_ONE)
    standard.compose(feature_mean).compose(dp_event.GaussianDpEvent(NOISE / 2.0), EPOCHS)
    print(f"standard RDP accounting (every iterate released): epsilon = {standard.get_epsilon(DELTA):.3f}")

    # The run alone: the library's lossless number (an f-DP profile converted exactly).
    alone = LastIterateAccountant(bound="best", neighboring_relation=REPLACE_ONE).compose(training_run(NOISE))
    print(f"last-iterate run alone: epsilon = {alone.get_epsilon(DELTA):.3f}")
    print("  " + alone.statement(DELTA))

    accountant = LastIterateAccountant(bound="best", neighboring_relation=REPLACE_ONE)  # a cyclic run: replace-one
    accountant.compose(dp_event.ComposedDpEvent([feature_mean, training_run(NOISE)]))
    print(f"last-iterate accountant (RDP): epsilon = {accountant.get_epsilon(DELTA):.3f}")
    print("  " + accountant.statement(DELTA))

    # The run is mu-GDP: the PLD accountant composes it as a Gaussian mechanism. Standard events
    # mean what the installed dp-accounting's PLD says (0.6 doubles the replace-one sensitivity of
    # GaussianDpEvent itself): host_gaussian_shift converts the feature mean's noise.
    pld = LastIteratePldAccountant(bound="best")
    feature_mean_pld = dp_event.GaussianDpEvent(8.0 / 2.0 * pld.host_gaussian_shift)
    pld.compose(dp_event.ComposedDpEvent([feature_mean_pld, training_run(NOISE)]))
    print(
        f"last-iterate accountant (PLD): epsilon = {pld.get_epsilon(DELTA):.3f}; mu = "
        f"{training_run(NOISE).gaussian_mu():.4f}"
    )
    print("  " + pld.statement(DELTA))

    # The ledger is an ordinary DpEvent: it serialises and replays.
    restored = dp_event.DpEvent.from_named_tuple(accountant.ledger.to_named_tuple())
    replayed = LastIterateAccountant(neighboring_relation=REPLACE_ONE).compose(restored).get_epsilon(DELTA)
    print(f"  ledger replayed into a fresh accountant: epsilon = {replayed:.3f}")

    target = 3.0
    noise = dp_accounting.calibrate_dp_mechanism(
        lambda: LastIterateAccountant(neighboring_relation=REPLACE_ONE),
        lambda z: dp_event.ComposedDpEvent([feature_mean, training_run(z)]),
        target_epsilon=target,
        target_delta=DELTA,
    )
    check = LastIterateAccountant(neighboring_relation=REPLACE_ONE)
    check.compose(dp_event.ComposedDpEvent([feature_mean, training_run(noise)]))
    print(f"noise multiplier for epsilon <= {target} on the whole pipeline: {noise:.4f}")
    print(f"  (check: epsilon = {check.get_epsilon(DELTA):.4f})")


if __name__ == "__main__":
    main()
