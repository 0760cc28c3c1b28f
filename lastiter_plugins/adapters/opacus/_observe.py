"""What one DPOptimizer step does: the optimizer facts (validated, in the core's terms),
the examples that entered it, and the parameters it may change."""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from opacus.grad_sample import AbstractGradSampleModule
from opacus.optimizers import DistributedDPOptimizer, DPOptimizer
from torch.nn.utils.rnn import PackedSequence

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts
from lastiter_plugins.adapters.opacus._registration import LastIterateConfigurationError, Registration
from lastiter_plugins.config import poisson_batch_size

Sampling = lp.Sampling
ALLOWED_OPTIMIZERS = (DPOptimizer, DistributedDPOptimizer)  # exact types: flat clipping, hooks/ew/functorch
#: DPOptimizer methods that compute this step's clipped sum and noise: an instance attribute overriding one
#: of them changes the mechanism without changing the optimizer's type
STEP_METHODS = ("pre_step", "clip_and_accumulate", "add_noise", "scale_grad", "_get_flat_grad_sample")


@dataclasses.dataclass(frozen=True)
class Observed:
    """What one optimizer step does, in Opacus' terms and in the core's terms."""

    noise_multiplier: float
    clip_norm: float
    loss_reduction: str
    normaliser: float  # N: the noisy sum is divided by N
    accumulated_iterations: int  # always 1 (several backward passes per step are refused); kept for checkpoints
    sampling: str
    loader_batches: int
    loader_batch_size: int | None
    sample_rate: float  # per loader batch, as Opacus records it (1 / len(loader))
    batch_size: int  # b of the core
    learning_rate: float  # lr * b / N, the core's step size
    permutation_digest: str | None = None  # shuffle_once: SHA-256 of the permutation (resumption must reuse it)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observed:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {"permutation_digest": None, **data}  # checkpoints of format 1 have none
        if set(data) != fields:
            raise ValueError(f"observation must have the keys {sorted(fields)}. Found {sorted(data)}.")
        return cls(**data)


def check_sgd(optimizer: Any, reg: Registration) -> float:
    """Plain constant-step SGD with the registered learning rate; returns it."""
    if type(optimizer) is not torch.optim.SGD:
        raise LastIterateConfigurationError(
            "the optimizer must be plain torch.optim.SGD (the bounds analyse x - lr * noisy gradient). "
            f"Found {type(optimizer).__name__}. Adaptive or momentum methods are not covered by any bound."
        )
    derived = reg.weight_decays  # set only by the GLM route, which folds them into its derived constants
    everywhere = reg.weight_decay_everywhere  # l2_outside_clip declared by hand: the declared strong convexity
    if derived is not None and everywhere is None and len(optimizer.param_groups) != len(derived):
        raise LastIterateConfigurationError(
            f"the optimizer must keep the {len(derived)} parameter group(s) whose weight_decay the GLM constants "
            f"were derived for ({list(derived)}). Found {len(optimizer.param_groups)} groups. Decide the groups "
            "before make_private."
        )
    for i, group in enumerate(optimizer.param_groups):
        decay = everywhere if everywhere is not None else derived[i] if derived is not None else 0
        for key, neutral in (("momentum", 0), ("weight_decay", decay), ("nesterov", False), ("maximize", False)):
            value = group.get(key, 0 if key == "weight_decay" else neutral)
            value = value.item() if torch.is_tensor(value) else value
            if value != neutral:
                hint = (
                    " Fold weight decay into the loss as an l2 regulariser (and declare its strong convexity) instead."
                    if key == "weight_decay" and derived is None and everywhere is None
                    else ""
                )
                what = (
                    ("the declared strong_convexity (l2_outside_clip)" if everywhere is not None
                     else "the value the GLM constants were derived for")
                    if key == "weight_decay" and (everywhere is not None or derived)
                    else ""
                )  # fmt: skip
                raise LastIterateConfigurationError(
                    f"{key} must be {neutral} for a last-iterate bound (plain SGD{'; ' + what if what else ''}). "
                    f"Found {key}={value} in param_groups[{i}].{hint}"
                )
        lr = group["lr"]
        lr = float(lr.item() if torch.is_tensor(lr) else lr)
        if lr != reg.learning_rate:
            raise LastIterateConfigurationError(
                f"learning_rate must stay equal to the registered {reg.learning_rate:g} for accountant "
                f"{reg.name!r} (constant step size; learning-rate schedules are refused because no direction is "
                f"safe for every bound). Found lr={lr:g} in param_groups[{i}]. Register the learning rate you use "
                "and remove any scheduler."
            )
    return reg.learning_rate


def check_clip(clip: Any) -> None:
    """``max_grad_norm``: one finite number > 0 (flat clipping)."""
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not (0 < clip < math.inf):  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
        raise LastIterateConfigurationError(f"max_grad_norm must be a single finite number > 0. Found {clip!r}.")


def check_dp_optimizer(optim: Any, reg: Registration) -> None:
    """The static part: DPOptimizer type, flat clipping, its own step methods, plain SGD inside."""
    if type(optim) not in ALLOWED_OPTIMIZERS:
        raise LastIterateConfigurationError(
            "the DP optimizer must be Opacus' DPOptimizer or DistributedDPOptimizer (clipping='flat', "
            f"grad_sample_mode 'hooks'). Found {type(optim).__name__}; per-layer, adaptive and ghost clipping are "
            "not supported by this adapter."
        )
    patched = [m for m in STEP_METHODS if m in vars(optim)]
    if patched:
        raise LastIterateConfigurationError(
            f"the DP optimizer's {', '.join(patched)} must be Opacus' own (they compute the clipped sum and the "
            "noise this accountant certifies). Found them replaced on the optimizer object. Remove the override."
        )
    check_clip(optim.max_grad_norm)
    if optim.loss_reduction not in ("mean", "sum"):
        raise LastIterateConfigurationError(f"loss_reduction must be 'mean' or 'sum'. Found {optim.loss_reduction!r}.")
    check_sgd(optim.original_optimizer, reg)


def unwrap(module: Any) -> torch.nn.Module:
    """The user's model inside Opacus' GradSampleModule and (DP)DDP wrappers."""
    for _ in range(4):
        if isinstance(module, AbstractGradSampleModule):
            module = module._module
        elif type(module).__name__ in ("DistributedDataParallel", "DifferentiallyPrivateDistributedDataParallel"):
            module = module.module
        else:
            break
    return module


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


def core_batch(reg: Registration, facts: LoaderFacts) -> int:
    """b of the core: the loader's batch size (for Poisson ceil(n q))."""
    if facts.sampling is Sampling.POISSON:
        assert facts.sample_rate is not None  # a Poisson loader's facts carry its rate
        return poisson_batch_size(reg.dataset_size, facts.sample_rate)
    assert facts.batch_size is not None  # an epoch loader's facts carry its batch size
    return min(reg.dataset_size, facts.batch_size)


def observe(optim: Any, reg: Registration, facts: LoaderFacts) -> Observed:
    """Validate the optimizer of one step and express the step in the core's terms."""
    check_dp_optimizer(optim, reg)
    distributed = type(optim) is DistributedDPOptimizer
    if facts.distributed != distributed:
        raise LastIterateConfigurationError(
            "the data loader and the optimizer must agree on distribution: a distributed Poisson loader needs "
            "DistributedDPOptimizer and vice versa (wrap the model in DPDDP before make_private). "
            f"Found loader distributed={facts.distributed}, optimizer {type(optim).__name__}."
        )
    normaliser = optimizer_normaliser(optim)
    b = core_batch(reg, facts)
    noise = optim.noise_multiplier
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not (0 < noise < math.inf):  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
        raise LastIterateConfigurationError(f"noise_multiplier must be a finite number > 0. Found {noise!r}.")
    return Observed(
        noise_multiplier=float(noise),
        clip_norm=float(optim.max_grad_norm),
        loss_reduction=optim.loss_reduction,
        normaliser=normaliser,
        accumulated_iterations=1,
        sampling=facts.sampling.value,
        loader_batches=facts.num_batches,
        loader_batch_size=facts.batch_size,
        sample_rate=facts.opacus_sample_rate,
        batch_size=b,
        learning_rate=reg.learning_rate * b / normaliser,
        permutation_digest=facts.permutation_digest,
    )


class _Missing:
    """A parameter group without the key (``check_sgd`` reads its default then)."""


_MISSING = _Missing()
#: the types of the values :func:`raw_facts` may compare by value: immutable, equal only when the checks agree
_IMMUTABLE = frozenset({int, float, str, bool, type(None), _Missing})
_GROUP_KEYS = ("lr", "momentum", "weight_decay", "nesterov", "maximize")


def immutable_key(values: tuple) -> tuple | None:
    """``values`` with their types (1, 1.0 and True compare equal and are not checked alike), or None when one
    is not a plain immutable value (a tensor can change in place and stay the same object)."""
    types = tuple(map(type, values))
    return (types, values) if _IMMUTABLE.issuperset(types) else None


def raw_facts(optim: Any, reg: Registration) -> tuple | None:
    """Every value :func:`observe` reads from the DP optimizer, its SGD and ``reg`` (:func:`immutable_key`: None
    with a tensor lr, which can change in place: such a step is always validated in full). Equal tuples:
    ``observe`` would check the same values and return an equal result (``facts`` is the monitor's, fixed for
    its binding)."""
    base = optim.original_optimizer
    own = vars(optim)
    values = (
        optim.noise_multiplier,
        optim.max_grad_norm,
        optim.loss_reduction,
        optim.expected_batch_size,
        getattr(optim, "world_size", 1),
        reg.learning_rate,
        reg.weight_decay_everywhere,
        reg.dataset_size,
        *(group.get(key, _MISSING) for group in base.param_groups for key in _GROUP_KEYS),
    )
    key = immutable_key(values)
    if key is None:
        return None
    overridden = tuple(m in own for m in STEP_METHODS)
    return type(optim), type(base), len(base.param_groups), reg.weight_decays, overridden, key


def trainable(optim: Any) -> list[torch.Tensor]:
    """The parameters the DP optimizer clips, noises and updates (those with requires_grad)."""
    return [p for group in optim.original_optimizer.param_groups for p in group["params"] if p.requires_grad]


def batch_size_of(value: Any, dim: int, depth: int = 0) -> int | None:
    """Examples in a forward call's (nested) arguments: the size along ``dim`` of the first tensor
    found (depth first: tuples, lists, dicts, dataclasses), or a ``PackedSequence``'s number of
    sequences; None when there is no such tensor. The first tensor is taken as the batch, so that
    further arguments (a public table, a mask of another shape) do not count as examples."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[dim]) if value.dim() > dim else None
    if depth >= 4:
        return None
    if isinstance(value, PackedSequence):  # its data holds every time step of every sequence
        return int(value.batch_sizes[0]) if value.batch_sizes.numel() else None
    if isinstance(value, Mapping):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = (getattr(value, field.name) for field in dataclasses.fields(value))
    else:
        return None
    for item in items:
        size = batch_size_of(item, dim, depth + 1)
        if size is not None:
            return size
    return None


def _argument_types(args: Any, kwargs: Any) -> str:
    names = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()]
    return ", ".join(names) or "no arguments"


class ExampleCounter:
    """Counts the examples entering the private module in forward passes that record
    per-sample gradients (training mode, gradients enabled) since the last real step.

    A forward pre-hook that only reads the arguments (:func:`batch_size_of`). A call whose
    examples cannot be counted (no tensor with a batch dimension: a custom batch object)
    sets ``unknown`` to the argument types, for the step's refusal.
    """

    __slots__ = ("_dim", "_handle", "_module", "count", "unknown")

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self.unknown: str | None = None
        self._dim = 0 if getattr(module, "batch_first", True) else 1
        self._module = weakref.ref(module)
        self._handle = module.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not (module.training and torch.is_grad_enabled()):  # Opacus records no per-sample gradients then
            return
        first = args[0] if args else None  # (the usual call: the first tensor is the first argument)
        size = batch_size_of(first if type(first) is torch.Tensor else (args, kwargs), self._dim)
        if size is None:
            self.unknown = _argument_types(args, kwargs)
        else:
            self.count += size

    def reset(self) -> None:
        self.count = 0
        self.unknown = None

    def watches(self, module: Any) -> bool:
        return self._module is not None and self._module() is module

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()

    def __getstate__(self) -> dict[str, Any]:
        # pickling or copying the model (torch.save(model)) carries a detached counter
        return {"count": 0, "unknown": None, "_dim": self._dim, "_module": None, "_handle": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
