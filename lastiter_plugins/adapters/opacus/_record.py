"""What one DPOptimizer step does, in Opacus' terms and in the core's: the mechanism (noise, clipping,
normaliser, batch), validated, and the update (the optimizer and its learning rates), observed.

:class:`Observed` is the part that must stay constant for the whole run (a change breaks every row);
:class:`StepRecord` is the immutable record of one accounted step (the ledger keeps the last one).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from opacus.optimizers import DistributedDPOptimizer, DPOptimizer, DPPerLayerOptimizer

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts
from lastiter_plugins.config import poisson_batch_size

if TYPE_CHECKING:
    from lastiter_plugins.adapters.opacus._declaration import Registration

try:  # Opacus >= 1.5
    from opacus.optimizers import DPOptimizerFastGradientClipping
except ImportError:  # pragma: no cover - depends on the Opacus version
    DPOptimizerFastGradientClipping = None

Sampling = lp.Sampling
#: the DP optimizers whose mechanism a row covers, exact types, with their clipping: the sensitivity of the
#: clipped sum is one clip norm per example (flat; ghost: the same clip, computed in two backward passes), or
#: the l2 norm of the per-layer clip norms (per_layer), which Opacus uses as ``max_grad_norm`` and the noise scale
CLIPPING: dict[type, str] = {DPOptimizer: "flat", DistributedDPOptimizer: "flat", DPPerLayerOptimizer: "per_layer"}
if DPOptimizerFastGradientClipping is not None:
    CLIPPING[DPOptimizerFastGradientClipping] = "ghost"
#: DPOptimizer methods that compute this step's clipped sum and noise: an instance attribute overriding one
#: of them changes the mechanism without changing the optimizer's type
STEP_METHODS = ("pre_step", "clip_and_accumulate", "add_noise", "scale_grad", "_get_flat_grad_sample")


@dataclasses.dataclass(frozen=True)
class Observed:
    """The mechanism of a step, in Opacus' terms and in the core's: constant for the whole run."""

    noise_multiplier: float  # z of the core: Opacus' noise std over the sensitivity
    clip_norm: float  # the sensitivity of the clipped sum, one example (per-layer: the l2 norm of the layers')
    loss_reduction: str
    normaliser: float  # N: the noisy sum is divided by N
    accumulated_iterations: int  # always 1 (several backward passes per step are refused); kept for checkpoints
    sampling: str
    loader_batches: int
    loader_batch_size: int | None
    sample_rate: float  # per loader batch, as Opacus records it (1 / len(loader))
    batch_size: int  # b of the core
    learning_rate: float | None  # the registered lr * b / N, the core's step size (None: not registered)
    permutation_digest: str | None = None  # shuffle_once: SHA-256 of the permutation (resumption must reuse it)
    clipping: str = "flat"  # flat | per_layer | ghost
    layer_clip_norms: tuple[float, ...] | None = None  # per_layer: Opacus' max_grad_norms
    allocations_per_epoch: int = 1  # random_allocation: k, the steps of an epoch each example joins

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observed:
        fields = {f.name for f in dataclasses.fields(cls)}
        # checkpoints of format 1 have no digest, of formats 1-3 no clipping, before random allocation no k
        defaults = {
            "permutation_digest": None,
            "clipping": "flat",
            "layer_clip_norms": None,
            "allocations_per_epoch": 1,
        }
        data = {**defaults, **data}
        if set(data) != fields:
            raise ValueError(f"observation must have the keys {sorted(fields)}. Found {sorted(data)}.")
        norms = data["layer_clip_norms"]
        return cls(**{**data, "layer_clip_norms": None if norms is None else tuple(float(c) for c in norms)})

    @property
    def mechanism(self) -> str:
        """The clipping and noise in words, for the report."""
        if self.clipping == "per_layer":
            norms = ", ".join(f"{c:g}" for c in self.layer_clip_norms or ())
            return (
                f"per-layer clipping: the sensitivity is the l2 norm of the per-layer clip norms [{norms}] = "
                f"{self.clip_norm:.6g} (Opacus' max_grad_norm and noise scale), effective noise multiplier "
                f"{self.noise_multiplier:.6g}"
            )
        how = "ghost clipping (two backward passes)" if self.clipping == "ghost" else "flat clipping"
        return f"{how}: clip norm {self.clip_norm:g}, noise multiplier {self.noise_multiplier:g}"


class StepRecord(NamedTuple):
    """One accounted step (immutable): its number, its mechanism, the update it took and the examples it summed."""

    step: int
    observed: Observed
    optimizer: str  # the torch optimizer's class, qualified
    learning_rates: tuple[float, ...]  # per parameter group, as the step used them
    gradients: int  # per-example clipped gradients summed


def positive(name: str, value: Any) -> float:
    """A finite number > 0 (not a bool), as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < value < math.inf):  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
        raise LastIterateConfigurationError(f"{name} must be a finite number > 0. Found {value!r}.")
    return float(value)


def check_clip(clip: Any) -> None:
    """``max_grad_norm``: one finite number > 0 (flat clipping)."""
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not (0 < clip < math.inf):  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
        raise LastIterateConfigurationError(f"max_grad_norm must be a single finite number > 0. Found {clip!r}.")


def clipping_of(optim: Any) -> str:
    """The clipping of a DP optimizer whose mechanism a row covers (:data:`CLIPPING`), or refuse naming it."""
    clipping = CLIPPING.get(type(optim))
    if clipping is None:
        adaptive = type(optim).__name__ == "AdaClipDPOptimizer"
        raise LastIterateConfigurationError(
            "the DP optimizer must be Opacus' DPOptimizer or DistributedDPOptimizer (clipping='flat'), "
            "DPPerLayerOptimizer (clipping='per_layer') or DPOptimizerFastGradientClipping (grad_sample_mode="
            f"'ghost'). Found {type(optim).__name__}"
            + (
                ": adaptive clipping moves its clip bound with a noisy count of the clipped examples and noises "
                "with another multiplier, which needs a row of its own (not yet in this library)."
                if adaptive
                else "; its mechanism (clipping, noise, distribution) is not one a row of this library covers."
            )
        )
    patched = [m for m in STEP_METHODS if m in vars(optim)]
    if patched:
        raise LastIterateConfigurationError(
            f"the DP optimizer's {', '.join(patched)} must be Opacus' own (they compute the clipped sum and the "
            "noise this accountant certifies). Found them replaced on the optimizer object. Remove the override."
        )
    return clipping


def sensitivity(optim: Any, clipping: str) -> tuple[float, float, tuple[float, ...] | None]:
    """(the sensitivity S of one example's clipped gradient, the noise multiplier relative to S, the per-layer
    clip norms). Per layer, S = sqrt(sum C_i^2), computed in float64 and raised by a relative 2^-49 (above
    every rounding of the computation); Opacus noises with std z * max_grad_norm, its float32 value of S: the
    multiplier counted is z * max_grad_norm / S when that is below z
    (docs/derivations/opacus-adapter.md#per-layer-clipping)."""
    noise = positive("noise_multiplier", optim.noise_multiplier)
    if clipping != "per_layer":
        check_clip(optim.max_grad_norm)
        return float(optim.max_grad_norm), noise, None
    norms = tuple(positive("max_grad_norm of a layer", c) for c in optim.max_grad_norms)
    exact = math.sqrt(math.fsum(c * c for c in norms)) * (1.0 + 2.0**-49)
    scale = positive("max_grad_norm", optim.max_grad_norm)  # what Opacus noises with (float32 norm)
    return exact, noise * min(1.0, scale / exact), norms


def loss_normaliser(loss_reduction: str, expected_batch_size: float, world_size: int = 1) -> float:
    """N, what Opacus divides the noisy clipped sum by: ``expected_batch_size * world_size`` for
    ``loss_reduction="mean"`` (``DPOptimizer.scale_grad``; ``DistributedDPOptimizer`` then averages the
    ranks' gradients), 1 for ``"sum"``. The only place N is computed."""
    return float(expected_batch_size) * int(world_size) if loss_reduction == "mean" else 1.0


def optimizer_normaliser(optim: Any) -> float:
    """N of a DP optimizer (its world size when distributed)."""
    world = int(getattr(optim, "world_size", 1) or 1) if type(optim) is DistributedDPOptimizer else 1
    return loss_normaliser(optim.loss_reduction, optim.expected_batch_size, world)


def planned_normaliser(loss_reduction: str, dataset_size: int, sample_rate: float) -> float:
    """N of the optimizer ``make_private`` will build: expected_batch_size = int(n q) in total over the ranks."""
    return loss_normaliser(loss_reduction, int(dataset_size * sample_rate))


def core_batch(dataset_size: int, facts: LoaderFacts) -> int:
    """b of the core: the loader's batch size (for Poisson ceil(n q); for random allocation the sampler's b, with
    t = ceil(n k / b) its steps an epoch)."""
    if facts.sampling is Sampling.POISSON:
        assert facts.sample_rate is not None  # a Poisson loader's facts carry its rate
        return poisson_batch_size(dataset_size, facts.sample_rate)
    assert facts.batch_size is not None  # an epoch loader's facts carry its batch size
    return min(dataset_size, facts.batch_size)


def core_learning_rate(learning_rate: float | None, batch_size: int, normaliser: float) -> float | None:
    """The core's step size: Opacus divides the noisy sum by N, the core by b: lr * b / N."""
    return None if learning_rate is None else learning_rate * batch_size / normaliser


def core_assumptions(reg: Registration, observed: Observed | None) -> lp.LossAssumptions:
    """The declared assumptions in the core's terms: an l2 term declared by hand (``l2_outside_clip``: torch
    SGD's ``weight_decay`` w, added to the gradient after Opacus divided the noisy sum by N) is, on the core's
    mean over b examples with step size lr b / N, the coefficient w N / b (<= w: N = int(n / len(loader)) <= b).
    The GLM route's derived constants carry the same factor already (``_glm_derive``)."""
    assumptions = reg.assumptions
    if observed is None or reg.weight_decay_everywhere is None or observed.normaliser >= observed.batch_size:
        return assumptions
    scaled = assumptions.strong_convexity * observed.normaliser / observed.batch_size
    return dataclasses.replace(assumptions, strong_convexity=scaled)


def observe(optim: Any, learning_rate: float | None, dataset_size: int, facts: LoaderFacts) -> Observed:
    """Validate the DP optimizer's mechanism and express it in the core's terms (``learning_rate``: the
    registered one)."""
    clipping = clipping_of(optim)
    distributed = type(optim) is DistributedDPOptimizer
    if facts.distributed != distributed:
        raise LastIterateConfigurationError(
            "the data loader and the optimizer must agree on distribution: a distributed Poisson loader needs "
            "DistributedDPOptimizer and vice versa (wrap the model in DPDDP before make_private). "
            f"Found loader distributed={facts.distributed}, optimizer {type(optim).__name__}."
        )
    if optim.loss_reduction not in ("mean", "sum"):
        raise LastIterateConfigurationError(f"loss_reduction must be 'mean' or 'sum'. Found {optim.loss_reduction!r}.")
    clip, noise, layers = sensitivity(optim, clipping)
    normaliser = optimizer_normaliser(optim)
    b = core_batch(dataset_size, facts)
    return Observed(
        noise_multiplier=noise,
        clip_norm=clip,
        loss_reduction=optim.loss_reduction,
        normaliser=normaliser,
        accumulated_iterations=1,
        sampling=facts.sampling.value,
        loader_batches=facts.num_batches,
        loader_batch_size=facts.batch_size,
        sample_rate=facts.opacus_sample_rate,
        batch_size=b,
        learning_rate=core_learning_rate(learning_rate, b, normaliser),
        permutation_digest=facts.permutation_digest,
        clipping=clipping,
        layer_clip_norms=layers,
        allocations_per_epoch=facts.allocations_per_epoch,
    )


class _Missing:
    """A parameter group without the key (the update check reads its default then)."""


MISSING = _Missing()
#: the types of the values :func:`raw_facts` may compare by value: immutable, equal only when the checks agree
_IMMUTABLE = frozenset({int, float, str, bool, type(None), _Missing})
#: the parameter-group keys the update check reads
GROUP_KEYS = ("lr", "momentum", "weight_decay", "nesterov", "maximize", "dampening")


def immutable_key(values: tuple) -> tuple | None:
    """``values`` with their types (1, 1.0 and True compare equal and are not checked alike), or None when one
    is not a plain immutable value (a tensor can change in place and stay the same object)."""
    types = tuple(map(type, values))
    return (types, values) if _IMMUTABLE.issuperset(types) else None


def raw_facts(optim: Any) -> tuple | None:
    """Every value :func:`observe` and the update check read from the DP optimizer and the torch optimizer it
    wraps (:func:`immutable_key`: None with a tensor lr, which can change in place: such a step is always
    checked in full). Equal tuples: the checks would read the same values and conclude alike."""
    base = optim.original_optimizer
    own = vars(optim)
    values = (
        optim.noise_multiplier,
        optim.max_grad_norm,
        *getattr(optim, "max_grad_norms", ()),
        optim.loss_reduction,
        optim.expected_batch_size,
        getattr(optim, "world_size", 1),
        *(group.get(key, MISSING) for group in base.param_groups for key in GROUP_KEYS),
    )
    key = immutable_key(values)
    if key is None:
        return None
    overridden = tuple(m in own for m in STEP_METHODS)
    return type(optim), type(base), len(base.param_groups), overridden, key


def plain(value: Any) -> Any:
    """A parameter-group value as a Python number (a 0-dim tensor's value)."""
    return value.item() if torch.is_tensor(value) else value


def trainable(optim: Any) -> list[torch.Tensor]:
    """The parameters the DP optimizer clips, noises and updates (those with requires_grad)."""
    return [p for group in optim.original_optimizer.param_groups for p in group["params"] if p.requires_grad]


def pipeline(dataset_size: int, sampling: lp.Sampling, relation: lp.Relation, observed: Observed, steps: int
             ) -> lp.TrainingConfig:  # fmt: skip
    """The core's pipeline of ``steps`` steps of the mechanism ``observed`` (the declared update: plain SGD at
    the registered rate; the departures weaken it)."""
    return lp.TrainingConfig(
        dataset_size=dataset_size,
        batch_size=observed.batch_size,
        noise_multiplier=observed.noise_multiplier,
        steps=steps,
        sampling=sampling,
        learning_rate=observed.learning_rate,
        clip_norm=observed.clip_norm,
        relation=relation,
        allocations_per_epoch=observed.allocations_per_epoch,
    )
