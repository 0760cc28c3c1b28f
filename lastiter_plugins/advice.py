r"""What would lower the epsilon: :func:`advise` (``lp.advise``) tries a fixed list of single changes to the
pipeline (sampling scheme, learning rate, weight decay, projection, the certified
linear-model route, noise) and returns those that lower ``best``, best first.

Every suggestion is evaluated by the one evaluation path (``epsilon("best", ...)`` with
the changed parameters) in the same neighbouring relation as the pipeline's; nothing
here is a bound of its own. A suggestion that changes training (the model, its
updates or its batches) says so: its number holds only for the changed run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any

from typing_extensions import Unpack

from lastiter_plugins.api import Parameters, epsilon
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.evaluation import EpsilonResult
from lastiter_plugins.registry import Protects


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """One single change and the epsilon it would give.

    Attributes:
      change: what to do, in words.
      parameters: the parameters to pass instead (only those that change).
      epsilon: ``best`` at the same delta with the change.
      winner: the bound that gives it.
      changes_training: True when the model, its updates or its batches change (the
        number then holds for the changed run only); False for a declaration alone.
      result: the full result, for its relation, proof and what it protects.
    """

    change: str
    parameters: Mapping[str, Any]
    epsilon: float
    winner: str
    changes_training: bool
    result: EpsilonResult

    def __str__(self) -> str:
        kind = "changes training" if self.changes_training else "accounting only"
        args = ", ".join(f"{k}={v!r}" for k, v in self.parameters.items())
        return f"{self.change} ({args}; {kind}): epsilon {self.epsilon:.4g} via {self.winner}"


def _candidates(params: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(words, parameter changes, changes_training), in a fixed order."""
    sampling = Sampling(params["sampling"])
    relation = Relation(params.get("relation", Relation.REPLACE_ONE))
    lr, smooth = params.get("learning_rate"), params.get("smoothness")
    convex = params.get("weak_convexity", 0.0) == 0.0
    z = params.get("noise_multiplier")
    if relation is Relation.REPLACE_ONE and sampling is not Sampling.SHUFFLE_ONCE:
        yield (
            "draw one secret permutation before training and keep its order every epoch (Opacus: "
            "lastiter_plugins.adapters.opacus.ShuffleOnceSampler; Keras: permute the data once, then "
            "fit(shuffle=False); keep the seed secret)",
            {"sampling": Sampling.SHUFFLE_ONCE.value},
            True,
        )
    if not params.get("gradient_norms_within_clip") and not params.get("clipped_loss_convex_smooth"):
        yield (
            "declare gradient_norms_within_clip=True, if every per-example gradient norm is at most the clip "
            "norm on the whole domain (a fact about your loss and domain that you must check)",
            {"gradient_norms_within_clip": True},
            False,
        )
        if smooth is not None and convex:
            yield (
                "train a linear model (logistic/softmax regression, a linear probe) with a feature clip and "
                "register it as one (model='glm'): the clipped update is then a gradient step",
                {"clipped_loss_convex_smooth": True},
                True,
            )
    if lr is not None:
        for factor in (0.5, 0.25, 0.1):
            yield f"lower the learning rate to {lr * factor:.4g}", {"learning_rate": lr * factor}, True
    if smooth is not None and convex and params.get("strong_convexity", 0.0) == 0.0:
        for decay in (1e-3, 1e-2):
            w = decay * max(smooth, 1.0)
            yield (
                f"add weight decay (an l2 term) of {w:.3g}: it adds {w:.3g} to the strong convexity and the smoothness",
                {"strong_convexity": w, "smoothness": smooth + w},
                True,
            )
    if params.get("diameter") is None:
        for d in (1.0, 10.0):
            yield (
                f"project the weights onto a ball of diameter {d:g} after every step (if they stay inside it anyway)",
                {"diameter": d},
                True,
            )
    if z is not None:
        for factor in (1.5, 2.0):
            yield f"raise the noise multiplier to {z * factor:.4g}", {"noise_multiplier": z * factor}, True


def advise(delta: float, *, top: int | None = None, **params: Unpack[Parameters]) -> tuple[Suggestion, ...]:
    r"""Single changes to the pipeline that lower ``best``, best first.

    Args:
      delta: the delta of the guarantee.
      top: return at most this many (default: all that help).
      **params: the pipeline, as for :func:`lastiter_plugins.epsilon`.

    Returns:
      The suggestions whose ``best`` (same relation) is below the pipeline's by more than
      0.1%, sorted by epsilon; one per kind of change (the lowest, e.g. one learning rate).

    Raises:
      NotApplicableError / ValueError: as :func:`lastiter_plugins.epsilon` for the pipeline itself.
    """
    current = epsilon("best", delta, **params)
    best_per_kind: dict[str, Suggestion] = {}
    for words, changes, changes_training in _candidates(params):
        try:
            result = epsilon("best", delta, **{**params, **changes})
        except (NotApplicableError, ValueError):
            continue
        if result.relation is not current.relation or not result.epsilon < current.epsilon * (1 - 1e-3):
            continue
        kind = ",".join(sorted(changes))
        suggestion = Suggestion(words, changes, result.epsilon, result.winner, changes_training, result)
        if kind not in best_per_kind or suggestion.epsilon < best_per_kind[kind].epsilon:
            best_per_kind[kind] = suggestion
    ranked = sorted(best_per_kind.values(), key=lambda s: (s.epsilon, s.changes_training))
    return tuple(ranked[:top] if top is not None else ranked)


def advise_config(
    delta: float, config: TrainingConfig, assumptions: LossAssumptions, *, top: int | None = None
) -> tuple[Suggestion, ...]:
    """:func:`advise` for a pipeline given as the objects the adapters hold."""
    params = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    params |= {f.name: getattr(assumptions, f.name) for f in dataclasses.fields(assumptions)}
    return advise(delta, top=top, **params)


def baseline_note(result: EpsilonResult, suggestions: tuple[Suggestion, ...]) -> str:
    """What the reports print under a ``best`` that is a standard baseline (empty otherwise)."""
    if result.bound != "best" or not is_standard_baseline(result):
        return ""
    lines = [
        f"This is a standard baseline ({result.winner}) that certifies every iterate: no last-iterate bound "
        "applies to this pipeline, or none is smaller. Single changes that would lower it (lastiter_plugins.advise):"
    ]
    lines += [f"  {s}" for s in suggestions] or ["  (no single change from the list lowers it)"]
    return "\n".join(lines)


def is_standard_baseline(result: EpsilonResult) -> bool:
    """True when ``best`` fell back to a standard accountant that certifies every iterate
    (no last-iterate bound applied, or none was smaller)."""
    return result.protects is Protects.EVERY_ITERATE and math.isfinite(result.epsilon)
