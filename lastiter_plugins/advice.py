r"""What would lower the epsilon: :func:`advise` (``lp.advise``) tries every single change to training
from a fixed list (noise, epochs, batch size, learning rate, weight decay, projection, the certified
linear-model route, features clipped so that clipping never acts, the sampler) and returns those that lower
``best``, best first. A declaration is never offered alone: only with the change to training that makes it
true. Each change is one the user's host can make, worded in its terms (``host=``, :data:`HOW`). On a
shuffled or fixed-order loader the sampler's changes include random allocation (each example still used
once per epoch), its note giving Poisson sampling's number beside it.

Every suggestion is evaluated by the one evaluation path (``epsilon("best", ...)`` with the
changed parameters); nothing here is a bound of its own. A suggestion that changes training (the
model, its updates or its batches) says so: its number holds only for the changed run. A
suggestion whose guarantee is for another neighbouring relation (Poisson sampling under
add-or-remove, what Opacus reports) is listed after the others with one sentence saying so: its
number does not compare with the pipeline's.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

from typing_extensions import Unpack, overload

from lastiter_plugins.api import Parameters, build, epsilon, pipeline
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, default_relation
from lastiter_plugins.defaults import HOSTS
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.evaluation import EpsilonResult
from lastiter_plugins.feasibility import impossible_declaration
from lastiter_plugins.overflow import DEFAULT_OVERFLOW, padded_batch_size
from lastiter_plugins.registry import Protects

#: Said once under every suggestion for another relation.
RELATION_NOTE = (
    "a different guarantee: add-or-remove neighbours (a record present or absent) instead of replace-one (a record "
    "replaced); a replace-one epsilon is at most twice an add-or-remove one, so the numbers do not compare."
)

#: The schemes of a shuffled or fixed-order loader: every example once per epoch, in batches of b.
_EPOCH_LOADERS = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
ALLOCATE = (
    "allocate every example to one step of each epoch, uniformly at random and afresh every epoch, from a secret "
    "seed (random allocation, balls in bins: every example still used once per epoch; batch sizes vary around b, "
    "the sum still divided by b)"
)

#: Smoothness of the per-example loss on the certified linear-model route when none is declared: binary
#: logistic regression on features clipped to norm 1 (|a|^2 / 4; docs/derivations/glm.md#glm-route).
GLM_SMOOTHNESS = 0.25


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
      note: what the change requires or means, when it needs saying (another relation, say).
    """

    change: str
    parameters: Mapping[str, Any]
    epsilon: float
    winner: str
    changes_training: bool
    result: EpsilonResult
    note: str = ""

    @property
    def relation(self) -> Relation:
        return self.result.relation

    def __str__(self) -> str:
        kind = "changes training" if self.changes_training else "accounting only"
        args = ", ".join(f"{k}={v!r}" for k, v in self.parameters.items())
        line = (
            f"{self.change} ({args}; {kind}): epsilon {self.epsilon:.4g} ({self.relation.value}, "
            f"{self.result.protects.value}) via {self.winner}"
        )
        return f"{line}. Note: {self.note}" if self.note else line


def _scaled_length(params: Mapping[str, Any], factor: float) -> dict[str, Any] | None:
    """The run's length times ``factor`` (epochs or steps, whichever was given), or None if unchanged."""
    key = "epochs" if params.get("epochs") is not None else "steps"
    value = params.get(key)
    if value is None:
        return None
    new = max(round(value * factor), 1)
    return {key: new} if new != value else None


#: How each host makes a change to training, in its own terms; a host missing from a change's entry cannot
#: make it (its adapter refuses or cannot observe it), and the change is not offered there. ``none``: the
#: core's terms, every change.
HOW: Mapping[str, Mapping[str, str]] = {
    "weight_decay": {
        "none": "an l2 term added after clipping, e.g. torch SGD weight_decay",
        "opacus": "torch.optim.SGD(weight_decay=w)",
        "jax": "a TrainingRun loop updating with optax.chain(optax.add_decayed_weights(w), optax.sgd(lr)) applied to "
        "the noisy clipped mean, declared l2_outside_clip=True; the Keras route's SGD(weight_decay=w) is not plain SGD",
    },  # keras: TF Privacy's optimizers add no l2 term after clipping (the adapter refuses Keras' weight decay)
    "projection": {
        "none": "project the weights after every step",
        "opacus": "lastiter_plugins.adapters.opacus.attach_projection(optimizer, diameter=D)",
        "keras": "lastiter_plugins.adapters.tf_privacy.ProjectionCallback(diameter=D)",
        "jax": "a TrainingRun loop projecting the parameters onto the ball after every update, declared diameter=D; "
        "the Keras route has no projection",
    },
    "linear_model": {
        "none": "a linear model on clipped features (logistic or softmax regression, a linear probe)",
        "opacus": "a linear model on clipped features registered as one (model='glm', FeatureNormClip)",
        "keras": "a linear model on clipped features (FeatureNormClip + Dense, model='glm')",
    },
    "feature_clip": {
        "none": "",
        "opacus": ", FeatureNormClip(C) before the linear layer",
        "keras": ", FeatureNormClip(C) before Dense",
        "jax": "",
    },
    "shuffle_once": {
        "none": "draw one secret permutation before training and keep its order every epoch",
        "opacus": "draw one secret permutation and keep it (lastiter_plugins.adapters.opacus.ShuffleOnceSampler)",
        "keras": "permute the data once with a secret seed, then fit(shuffle=False)",
        "jax": "permute the indices once with a secret key and keep that order every epoch",
    },
    "random_allocation": {
        "none": " (Opacus: RandomAllocationSampler; Keras: RandomAllocationDataset)",
        "opacus": " (DataLoader(ds, batch_sampler=RandomAllocationSampler(n, b)), lastiter_plugins.adapters.opacus)",
        "keras": " (fit(RandomAllocationDataset(x, y, batch_size=b, epochs=E).dataset), "
        "lastiter_plugins.adapters.tf_privacy; every batch padded to a fixed length)",
        "jax": " (each epoch, draw every example's step from a secret key)",
    },
    "poisson": {
        "none": "sample each batch by Poisson sampling at rate b/n from a secret seed",
        "opacus": "sample each batch by Poisson sampling at rate b/n (make_private(..., poisson_sampling=True))",
        "jax": "sample each batch by Poisson sampling at rate b/n from a secret key",
    },  # keras: fit passes over the data in epochs and cannot sample Poisson batches
}


def _candidates(params: Mapping[str, Any], host: str = "none") -> Iterator[tuple[str, dict[str, Any], bool, str]]:
    """(words, parameter changes, changes_training, note), in a fixed order; each a change to training the
    ``host`` can make, in its terms (:data:`HOW`). None is a declaration alone: a declaration is offered only
    with the change to training that makes it true."""
    sampling = Sampling(params["sampling"])
    relation = Relation.parse(params["relation"])  # resolved by advise: every candidate keeps it
    lr, smooth = params.get("learning_rate"), params.get("smoothness")
    convex = params.get("weak_convexity", 0.0) == 0.0
    lam = params.get("strong_convexity", 0.0) or 0.0
    outside = bool(params.get("l2_outside_clip"))
    glm = bool(params.get("clipped_loss_convex_smooth"))
    z, n, b = params.get("noise_multiplier"), params["dataset_size"], params["batch_size"]
    how = {change: hosts[host] for change, hosts in HOW.items() if host in hosts}
    # a public order (order_secret=False): a sampler changed to one with a secret seed makes it secret
    secret: dict[str, Any] = {} if params.get("order_secret", True) else {"order_secret": True}

    if secret:
        yield (
            "draw the batches from a secret seed (leave the generator unseeded, or seed it once with a secret "
            "64-bit number, e.g. secrets.randbits(64)): the order is then secret",
            dict(secret),
            True,
            "",
        )
    if z is not None:
        for factor in (1.5, 2.0):
            yield f"raise the noise multiplier to {z * factor:.4g}", {"noise_multiplier": z * factor}, True, ""
    for factor in (0.5, 0.25):
        shorter = _scaled_length(params, factor)
        if shorter is not None:
            ((key, value),) = shorter.items()
            yield f"train for {value} {key} instead", shorter, True, ""
    for factor in (2, 4):
        if b * factor <= n:
            changes: dict[str, Any] = {"batch_size": b * factor}
            if params.get("steps") is not None:  # the same number of epochs: fewer steps
                changes["steps"] = max(params["steps"] // factor, 1)
            yield f"use batches of {b * factor} (the same number of epochs)", changes, True, ""
    if lr is not None:
        rates = [lr * f for f in (0.1, 0.25, 0.5, 1.5, 2.0, 3.0)]
        if smooth is not None and lam > 0:  # the fastest contraction of a lam-strongly convex M-smooth step
            rates.append(2.0 / (smooth + lam))
        for rate in sorted(set(rates)):
            if rate != lr:
                verb = "lower" if rate < lr else "raise"
                yield f"{verb} the learning rate to {rate:.4g}", {"learning_rate": rate}, True, ""
    if smooth is not None and convex and (lam == 0.0 or outside) and "weight_decay" in how:
        base = smooth - lam  # the loss's own smoothness; weight decay adds to both constants
        for w in sorted({1e-3, 1e-2, 0.05, 0.1, 2 * lam, 5 * lam} - {0.0}):
            if w > lam:
                what = "add weight decay" if lam == 0.0 else "raise the weight decay"
                yield (
                    f"{what} w = {w:.3g} ({how['weight_decay']})",
                    {"strong_convexity": w, "smoothness": base + w, "l2_outside_clip": True},
                    True,
                    "",
                )
    if params.get("diameter") is None and "projection" in how:
        for d in (1.0, 10.0):
            yield (
                f"project the weights onto a ball of diameter D = {d:g} after every step ({how['projection']}; "
                "pick D so the weights stay inside it anyway)",
                {"diameter": d},
                True,
                "",
            )
    if not glm and convex and "linear_model" in how:
        needs = f"{how['linear_model']}: the clipped update is then a gradient step"
        m = smooth if smooth is not None else GLM_SMOOTHNESS
        route = {"clipped_loss_convex_smooth": True, "smoothness": m}
        said = "" if smooth is not None else f"smoothness {m:g} is binary logistic regression on features of norm <= 1"
        yield f"train {needs}", route, True, said
        if lam == 0.0 and "weight_decay" in how:
            yield (
                f"train {needs}, with weight decay 0.01 ({how['weight_decay']})",
                {**route, "smoothness": m + 0.01, "strong_convexity": 0.01, "l2_outside_clip": True},
                True,
                said,
            )
        if not params.get("gradient_norms_within_clip") and "feature_clip" in how:
            yield (
                f"train binary logistic regression on features clipped to norm C{how['feature_clip']} (softmax "
                "regression: to C/sqrt(2)): "
                "every per-example gradient norm is then <= C on the whole domain, so clipping never acts",
                {"gradient_norms_within_clip": True},
                True,
                "",
            )
    if relation is Relation.REPLACE_ONE and sampling is not Sampling.SHUFFLE_ONCE and "shuffle_once" in how:
        yield how["shuffle_once"], {"sampling": Sampling.SHUFFLE_ONCE.value, **secret}, True, ""
    if sampling in _EPOCH_LOADERS and "random_allocation" in how:
        allocate_words = ALLOCATE + how["random_allocation"]
        allocate: dict[str, Any] = {"sampling": Sampling.RANDOM_ALLOCATION.value, **secret}
        if default_relation(Sampling.RANDOM_ALLOCATION) is not relation:  # named: the number holds in this relation
            allocate["relation"] = relation.value
        yield allocate_words, allocate, True, ""
        if relation is Relation.REPLACE_ONE:
            changes = {
                "sampling": Sampling.RANDOM_ALLOCATION.value,
                "relation": Relation.ADD_OR_REMOVE_ONE.value,
                **secret,
            }
            yield allocate_words + ", accounted under add-or-remove", changes, True, RELATION_NOTE
    if sampling is not Sampling.POISSON and "poisson" in how:
        poisson = how["poisson"]
        same: dict[str, Any] = {"sampling": Sampling.POISSON.value, **secret}
        if default_relation(Sampling.POISSON) is not relation:  # named: the number holds in this relation
            same["relation"] = relation.value
        yield poisson, same, True, ""
        if relation is Relation.REPLACE_ONE:
            changes = {"sampling": Sampling.POISSON.value, "relation": Relation.ADD_OR_REMOVE_ONE.value, **secret}
            as_host = " as Opacus does" if host in ("none", "opacus") else ""
            yield poisson + ", accounted under add-or-remove" + as_host, changes, True, RELATION_NOTE


def _check_top(top: Any) -> int | None:
    if top is None:
        return None
    if isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 1:
        raise ValueError(f"top must be an integer >= 1 (or None: every suggestion). Found {top!r}.")
    return int(top)


def _check_host(host: Any) -> str:
    if host not in HOSTS:
        raise ValueError(f"host must be one of {', '.join(HOSTS)}. Found {host!r}.")
    return str(host)


@overload
def advise(
    delta: float, *, top: int | None = None, host: str = "none", **params: Unpack[Parameters]
) -> tuple[Suggestion, ...]: ...
@overload
def advise(
    delta: float,
    *,
    top: int | None = None,
    host: str = "none",
    config: TrainingConfig,
    assumptions: LossAssumptions | None = None,
) -> tuple[Suggestion, ...]: ...
def advise(
    delta: float,
    *,
    top: int | None = None,
    host: str = "none",
    config: TrainingConfig | None = None,
    assumptions: LossAssumptions | None = None,
    **params: Any,
) -> tuple[Suggestion, ...]:
    r"""Every single change to the pipeline that lowers ``best``, best first.

    Args:
      delta: the delta of the guarantee.
      top: return at most this many (an integer >= 1; default: all that help).
      host: the library the user trains with (``none``, ``opacus``, ``keras``, ``jax``): suggestions are worded
        in its terms, and changes it cannot make (Keras: Poisson sampling, weight decay after clipping) are
        left out (:data:`HOW`).
      config, assumptions: the pipeline as the objects the adapters hold (or give ``params``; see
        :func:`lastiter_plugins.api.pipeline`).
      **params: the pipeline, as for :func:`lastiter_plugins.epsilon`.

    Returns:
      The suggestions whose ``best`` in the pipeline's relation is below the pipeline's by more
      than 0.1%, sorted by epsilon, one per kind of change (the lowest, e.g. one learning rate; one per sampler);
      then the suggestions for another relation whose number is below the pipeline's (Poisson
      sampling under add-or-remove), each with a note that the numbers do not compare.

    Raises:
      NotApplicableError / ValueError: as :func:`lastiter_plugins.epsilon` for the pipeline itself;
        ValueError for a ``top`` that is not an integer >= 1.
    """
    top = _check_top(top)
    host = _check_host(host)
    if config is not None or assumptions is not None:
        config, assumptions = pipeline(config, assumptions, params)
        params = _as_params(config, assumptions)
    current = epsilon("best", delta, **params)
    impossible = impossible_declaration(*build(**params))  # warned once, by epsilon: the user's own pipeline
    # the relation resolved once (the scheme's default when left out): a candidate that changes the sampling
    # keeps it, unless the change names another relation
    params = {**params, "relation": current.relation}
    best_per_kind: dict[tuple[str, str, str], Suggestion] = {}
    for words, changes, changes_training, note in _candidates(params, host):
        try:
            changed = build(**_fixed_length({**params, **changes}, host))
            if impossible_declaration(*changed) is not None and not impossible:  # never advise a set no loss meets
                continue
            result = epsilon("best", delta, config=changed[0], assumptions=changed[1])
        except (NotApplicableError, ValueError):
            continue
        if not result.epsilon < current.epsilon * (1 - 1e-3):
            continue
        kind = (result.relation.value, ",".join(sorted(changes)), str(changes.get("sampling", "")))  # a sampler each
        suggestion = Suggestion(words, changes, result.epsilon, result.winner, changes_training, result, note)
        if kind not in best_per_kind or suggestion.epsilon < best_per_kind[kind].epsilon:
            best_per_kind[kind] = suggestion
    for kind, suggestion in best_per_kind.items():
        if suggestion.parameters.get("sampling") == Sampling.RANDOM_ALLOCATION.value:
            best_per_kind[kind] = _beside_poisson(suggestion, params, delta)
    same = [s for s in best_per_kind.values() if s.relation is current.relation]
    other = [s for s in best_per_kind.values() if s.relation is not current.relation]
    ranked = sorted(same, key=lambda s: (s.epsilon, s.changes_training)) + sorted(other, key=lambda s: s.epsilon)
    return tuple(ranked[:top] if top is not None else ranked)


def _fixed_length(params: dict[str, Any], host: str) -> dict[str, Any]:
    """A changed pipeline's batch cut: none unless it samples by random allocation; with Keras, the length L its
    RandomAllocationDataset pads to by default for that pipeline, and the optimizer's learning rate eta (which TF
    Privacy then applies to the sum over L rows) as the core's eta b / L (docs/derivations/fixed-length-batches.md,
    part 5). A pipeline already cut keeps its L and its rate (a change of batches can then only make it looser)."""
    if params.get("sampling") != Sampling.RANDOM_ALLOCATION.value:
        return {**params, "max_batch_size": None}
    if host != "keras" or params.get("max_batch_size") is not None:
        return params
    config, _ = build(**params)
    k = config.allocations_per_epoch
    length = padded_batch_size(config.dataset_size, config.batch_size, k, config.steps, DEFAULT_OVERFLOW)
    rate = params.get("learning_rate")
    scaled = None if rate is None else rate * config.batch_size / length
    return {**params, "max_batch_size": length, "learning_rate": scaled}


def _beside_poisson(suggestion: Suggestion, params: Mapping[str, Any], delta: float) -> Suggestion:
    """The random-allocation suggestion with Poisson sampling's number (same rate b/n, same relation) in its note."""
    try:
        poisson = epsilon("best", delta, **{**params, "sampling": Sampling.POISSON.value, "max_batch_size": None,
                                            "relation": suggestion.relation.value})  # fmt: skip
        beside = (
            f"Poisson sampling at rate b/n gives {poisson.epsilon:.4g} ({poisson.relation.value}, via {poisson.winner})"
        )
    except (NotApplicableError, ValueError) as exc:
        beside = f"Poisson sampling at rate b/n gives no number here ({exc})"
    note = f"{suggestion.note} {beside}." if suggestion.note else f"{beside}."
    return dataclasses.replace(suggestion, note=note)


def _as_params(config: TrainingConfig, assumptions: LossAssumptions) -> dict[str, Any]:
    """The keyword parameters of a pipeline given as objects (the candidates change them one by one)."""
    params = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return params | {f.name: getattr(assumptions, f.name) for f in dataclasses.fields(assumptions)}


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
