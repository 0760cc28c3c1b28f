r"""What an instance is, checked against what the user declared (docs/derivations/lower-end.md#lower-end).

Every instance family (:mod:`~lastiter_plugins.lower_end.instances`: G1-G4,
:mod:`~lastiter_plugins.lower_end.last_use`: G5, G6) describes its losses, domain and run by an
:class:`InstanceProperties`; :func:`violations` compares it with the pipeline and the declared
:class:`LossAssumptions` before any number is computed. An instance that misses a declaration bounds
nothing and is never used.
"""

from __future__ import annotations

import dataclasses

from lastiter_plugins.config import LossAssumptions, TrainingConfig

#: The answer when an instance would cost more than the lower end may (about a second).
TOO_LARGE = "too large to compute exactly"
#: The probability, under either dataset, that an instance leaves the region where the pipeline equals
#: its exact (Gaussian) law: the radii and switches of the instances aim at it.
ESCAPE_BUDGET = 1e-30


@dataclasses.dataclass(frozen=True)
class InstanceProperties:
    """What an instance's losses and run are, to be checked against the declarations.

    Attributes:
      family: "G1" ... "G6".
      smoothness: the instance's smoothness constant (of the whole loss, l2 term included).
      strong_convexity: its strong convexity (of the whole loss).
      per_example_strong_convexity: the part of it inside each per-example loss.
      diameter: the diameter of the domain it projects onto (None: no projection).
      max_gradient_norm: the largest per-example (data) gradient norm on the whole domain.
      scalar_glm: every per-example loss is phi(<a, x>) with phi convex.
      l2_outside: the l2 weight added after the clipped mean.
      config: the run (the same as the pipeline's).
    """

    family: str
    smoothness: float
    strong_convexity: float
    per_example_strong_convexity: float
    diameter: float | None
    max_gradient_norm: float
    scalar_glm: bool
    l2_outside: float
    config: TrainingConfig


def violations(props: InstanceProperties, config: TrainingConfig, a: LossAssumptions) -> list[str]:
    """Every declaration (and pipeline parameter) the instance does not meet, in words (empty: it meets all)."""
    out = []
    if props.config != config:
        out.append(f"the instance runs {props.config}, not the declared pipeline {config}")
    if a.smoothness is not None and props.smoothness > a.smoothness:
        out.append(f"smoothness {props.smoothness:g} > declared {a.smoothness:g}")
    if props.strong_convexity < a.strong_convexity:
        out.append(f"strong convexity {props.strong_convexity:g} < declared {a.strong_convexity:g}")
    if a.l2_outside_clip:
        if props.l2_outside < a.strong_convexity or props.per_example_strong_convexity > 0:
            out.append("the strong convexity is not an l2 term outside the clip")
    elif props.l2_outside > 0:
        out.append("an l2 term outside the clip was not declared")
    if props.diameter != a.diameter:
        out.append(f"domain diameter {props.diameter} differs from the declared {a.diameter}")
    if (a.gradient_norms_within_clip or a.clipped_loss_convex_smooth) and props.max_gradient_norm > config.clip_norm:
        out.append(f"per-example gradient norms reach {props.max_gradient_norm:g} > C = {config.clip_norm:g}")
    if a.clipped_loss_convex_smooth and not props.scalar_glm:
        out.append("the per-example losses are not scalar GLMs")
    return out
