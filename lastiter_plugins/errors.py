"""Typed errors. All are ValueError subclasses, so ``except ValueError`` catches them."""

from __future__ import annotations


class NotApplicableError(ValueError):
    """A bound's preconditions do not hold for the declared pipeline.

    The message names the violated condition and the theorem it comes from.
    A bound that does not apply never returns a number.
    """


class CalibrationError(ValueError):
    """No noise multiplier up to the cap reaches the target epsilon."""
