r"""Declarations no loss can meet: the one definition (:func:`impossible_declaration`), used by the API and the
command line (which warn, :class:`~lastiter_plugins.errors.ImpossibleDeclarationWarning`, before any number),
by the lower end (which has no instance to build for them) and by the adapters (which refuse them: a real run
has real losses). docs/derivations/lower-end.md#no-loss has the two short proofs.

A strong convexity above the smoothness is refused when :class:`~lastiter_plugins.config.LossAssumptions` is
built (a ValueError): no such assumptions object exists to be checked here.
"""

from __future__ import annotations

import warnings

from lastiter_plugins.config import LossAssumptions, TrainingConfig
from lastiter_plugins.errors import ImpossibleDeclarationWarning

__all__ = ["impossible_declaration", "warn_if_impossible"]


def impossible_declaration(config: TrainingConfig, assumptions: LossAssumptions) -> str | None:
    r"""Why no per-example loss meets the declarations, or None when some loss may.

    A per-example loss that is lam-strongly convex (lam > 0, inside each loss: not ``l2_outside_clip``) has
    :math:`|\nabla f(x) - \nabla f(y)| \ge \lambda |x - y|`, so on a domain of diameter D some gradient has
    norm at least lam D / 2, and on an unbounded domain (no projection) gradients are unbounded. Declaring
    that the (clipped) per-example update is the gradient of such a loss with norms <= C
    (``gradient_norms_within_clip``, or the linear-model route ``clipped_loss_convex_smooth``) is therefore
    impossible without a projection, and with a projection of diameter D when lam D / 2 > C.

    Args:
      config: the training run (its clip norm C).
      assumptions: the declared loss assumptions.

    Returns:
      One sentence naming the declarations, the constraint and the values, with what to do; None when the
      declarations can be met.
    """
    a = assumptions
    lam = a.strong_convexity
    if lam <= 0 or a.l2_outside_clip or not a.update_is_gradient_step:
        return None
    flag = "gradient_norms_within_clip=True" if a.gradient_norms_within_clip else "clipped_loss_convex_smooth=True"
    if a.diameter is None:
        return (
            "no loss meets these declarations: a per-example loss that is strongly convex on an unbounded domain "
            f"has unbounded gradients, so strong_convexity={lam:g} with {flag} and no projection (diameter=None) "
            "cannot hold (its gradients cannot all have norm <= C). Declare the strong convexity as an l2 term outside "
            "the clip (l2_outside_clip=True: the optimizer's weight decay, added after clipping), project onto a "
            "set of diameter D with strong_convexity * D / 2 <= C, or set strong_convexity=0"
        )
    if lam * a.diameter / 2.0 > config.clip_norm:
        return (
            f"no loss meets these declarations: strong_convexity * diameter / 2 = {lam * a.diameter / 2.0:g} > "
            f"clip_norm = {config.clip_norm:g} with {flag}: a strongly convex loss on a set of diameter D has a "
            "gradient of norm >= strong_convexity * D / 2 somewhere. Lower the strong convexity or the diameter, or "
            "raise the clip norm"
        )
    return None


def warn_if_impossible(config: TrainingConfig, assumptions: LossAssumptions, *, stacklevel: int = 3) -> str | None:
    """Warn (:class:`~lastiter_plugins.errors.ImpossibleDeclarationWarning`) when no loss meets the
    declarations; returns the reason (None: nothing to warn about)."""
    why = impossible_declaration(config, assumptions)
    if why is not None:
        warnings.warn(
            f"{why}. Every number below is for a model that cannot exist.", ImpossibleDeclarationWarning, stacklevel
        )
    return why
