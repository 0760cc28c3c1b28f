"""The mechanism stays the first step's (every row): noise multiplier, clipping, loss reduction, normaliser,
batch plan and sampling, as Opacus used them this step (the hook runs right after Opacus clipped and noised).
A noise or clipping schedule is a mechanism no row of this library covers; a resumed run continues the
checkpoint's mechanism, at an epoch boundary for the epoch schemes and random allocation."""

from __future__ import annotations

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError as _Error
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.host import Departure

_EPOCH_SCHEMES = (lp.Sampling.CYCLIC, lp.Sampling.SHUFFLE_ONCE, lp.Sampling.RESHUFFLE, lp.Sampling.RANDOM_ALLOCATION)


def check_permutation(sampling: lp.Sampling, saved: str | None, current: str | None) -> None:
    """A resumed shuffle-once run uses the checkpoint's permutation."""
    if saved != current:
        raise _Error(
            f"a run with sampling={sampling.value} must resume with the same permutation: the "
            "shuffle-once bound assumes one permutation for the whole run. Found a ShuffleOnceSampler whose "
            f"permutation differs from the checkpoint's (digest {str(current)[:12]} vs {str(saved)[:12]}). "
            "Build the ShuffleOnceSampler with the seed of the interrupted run."
        )


class ConstantMechanism(Check):
    """The step's mechanism (``step.observed``) against the run's (the ledger's: the first step's, or the
    checkpoint's)."""

    def at_step(self, step: Step) -> Departure | None:
        ledger, observed = step.run.ledger, step.observed
        before = ledger.observed
        if ledger.resumed and before is not None:
            check_permutation(step.registration.sampling, before.permutation_digest, observed.permutation_digest)
        if before is not None and observed is not before and observed != before:
            changed = [
                f"{k}: {getattr(before, k)!r} -> {getattr(observed, k)!r}"
                for k in observed.to_dict()
                if getattr(observed, k) != getattr(before, k)
            ]
            raise _Changed(
                f"the noise and clipping must stay constant for every row of this library (step {step.number}). "
                f"Found a change in {'; '.join(changed)}. Noise, clipping and batch-size schedules are not "
                "covered; start a new accountant for a new configuration."
            )
        steps = step.number - 1
        if (
            ledger.resumed
            and lp.Sampling(observed.sampling) in _EPOCH_SCHEMES
            and steps % observed.loader_batches
            and not step.run.derivation.continues_a_pass  # (a fixed order saved mid-pass: the batch check decides)
        ):
            raise _Error(
                f"a run with sampling={observed.sampling} must resume at an epoch boundary (a restarted data "
                f"loader would reuse the examples of the interrupted epoch). Found {steps} steps, "
                f"{observed.loader_batches} per epoch. Save checkpoints at the end of epochs."
            )
        return None
