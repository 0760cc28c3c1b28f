"""Typed errors. All are ValueError subclasses, so ``except ValueError`` catches them.

One family for "this pipeline is not covered": :class:`NotApplicableError` and its
subclasses, raised by the core (a bound's precondition fails for the declared
pipeline) and by the adapters (what a training step actually did differs from the
declaration, or the host library is a version the adapter was not tested with).
"""

from __future__ import annotations


class NotApplicableError(ValueError):
    """A bound's preconditions do not hold for the pipeline.

    The message names the violated condition and the theorem it comes from.
    A bound that does not apply never returns a number.
    """


class PipelineChangedError(NotApplicableError):
    """An observed training step differs from what the accountant was configured
    with (batch size, data source, sampler, noise, clip norm, learning rate,
    parameters, projection, one clipped gradient per example). The epsilon of the
    run is void; the message names what changed and how to fix it."""


class UnsupportedHostError(NotApplicableError):
    """The host library (Opacus, Keras/TF Privacy, dp-accounting) is a version
    whose internals the adapter was not tested against."""


class CalibrationError(ValueError):
    """No noise multiplier up to the cap reaches the target epsilon."""


class BoundBelowTruthError(ValueError):
    """A proven bound's epsilon is below the exact epsilon of an instance that meets every
    declaration (docs/derivations/lower-end.md#lower-end): a bug in that bound, never a user error.
    Raised instead of reporting a number known to be wrong."""


class ImpossibleDeclarationWarning(UserWarning):
    """The declared loss assumptions describe no loss at all (a strongly convex loss whose gradients all stay
    within the clip on an unbounded domain, say): every number computed from them is about a model that cannot
    exist. Raised as a warning by the API and the command line, before any number
    (:func:`lastiter_plugins.feasibility.impossible_declaration` says which set and why); the adapters, which
    run real losses, refuse such declarations."""
