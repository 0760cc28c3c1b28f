r"""Last-iterate accountants behind Opacus' ``PrivacyEngine(accountant=...)``.

Tested against Opacus 1.6.0 (torch 2.13). Usage::

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    lastiter_opacus.register("last-iterate", sampling="cyclic", dataset_size=len(dataset),
                             learning_rate=0.1, smoothness=1.0)
    engine = PrivacyEngine(accountant="last-iterate")
    model, optimizer, loader = engine.make_private(..., poisson_sampling=False)  # DataLoader(shuffle=False)
    ...train...
    engine.get_epsilon(delta)            # final model only, replace-one neighbours
    print(engine.accountant.report(delta))

What the accountant sees and checks (see docs/opacus.md):

- Data loader. Opacus gives an accountant only ``get_optimizer_hook_fn(sample_rate)``.
  When that is called from Opacus 1.6's ``PrivacyEngine.make_private`` (matched by
  its code object), the accountant reads, without changing anything, the
  ``data_loader`` and ``optimizer`` that ``make_private`` has just prepared and
  checks them there, so a contradiction raises inside ``make_private``. A custom
  engine must call :meth:`LastIterateAccountant.bind_data_loader` instead, or the
  first step refuses. :func:`describe_data_loader` gives the mapping
  loader -> sampling scheme; :func:`check_data_loader` checks a declaration.
- Optimizer, at every step (the hook runs before the parameters change, so a
  refusal leaves the model untouched): DPOptimizer or DistributedDPOptimizer with
  flat clipping wrapping a plain ``torch.optim.SGD`` (no momentum, nesterov,
  weight decay, maximize) whose learning rate equals the registered one on every
  step (a scheduler is refused: no safe direction exists for every bound); constant
  noise multiplier, clipping norm, loss reduction and number of accumulated batches.
- Skipped steps (``signal_skip_step``): only Opacus' ``BatchMemoryManager`` splitting
  one loader batch is accepted; accumulating several loader batches into one noisy
  step is refused (a read-only forward pre-hook on the private module counts the
  examples since the last real step; for Poisson the BatchMemoryManager sampler is
  looked up).
- Projection: bounds that need a diameter D need :func:`attach_projection` on the
  optimizer being accounted for.
- Checkpoints: a shuffle-once run must resume with the same permutation (digest).

Mapping of Opacus' update to the core's ``TrainingConfig`` (exact, not an
approximation): Opacus computes ``x - lr / N * (sum of clipped gradients + N(0, (zC)^2))``
with N = expected_batch_size * accumulated_iterations * world_size for
``loss_reduction="mean"`` and N = 1 for "sum". The core's update divides by the
batch size b, so we set b = (largest logical batch: loader batch size x accumulated
batches; for Poisson ceil(n q)) and learning_rate = lr * b / N. For "sum" this is
lr * b, never the optimistic "b = 1".
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import math
import numbers
import secrets
import sys
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lastiter_plugins import registry
from lastiter_plugins.api import EpsilonResult, compute_epsilon
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.conversion import validate_delta, validate_orders

try:  # the host library is optional for the package, required for this module
    import torch
    from opacus.accountants import IAccountant, register_accountant
    from opacus.optimizers import DistributedDPOptimizer, DPOptimizer
    from opacus.privacy_engine import PrivacyEngine
    from opacus.utils.batch_memory_manager import BatchSplittingSampler
    from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler, UniformWithReplacementSampler
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lastiter_plugins.adapters.opacus needs torch and opacus: pip install 'lastiter-plugins[opacus]'"
    ) from exc

__all__ = [
    "THREAT_MODEL",
    "LastIterateAccountant",
    "LastIterateConfigurationError",
    "LoaderFacts",
    "Projection",
    "Registration",
    "Report",
    "ReportRow",
    "ShuffleOnceSampler",
    "attach_projection",
    "check_data_loader",
    "describe_data_loader",
    "register",
    "registration",
]

#: What every number of this adapter protects (printed by :meth:`LastIterateAccountant.report`).
THREAT_MODEL = (
    "Threat model: the last-iterate bounds protect the FINAL model only, after the number of steps fixed in "
    "advance; intermediate checkpoints (and any model saved during training) must not be released. Choosing the "
    "released model by looking at intermediate iterates (a best-validation checkpoint, early stopping that restores "
    "the best weights) or stopping at a data-dependent time is not covered by a last-iterate bound. The composition "
    "row certifies every iterate."
)

_EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
_ALLOWED_OPTIMIZERS = (DPOptimizer, DistributedDPOptimizer)  # exact types: flat clipping, hooks/ew/functorch


class LastIterateConfigurationError(ValueError):
    """The Opacus pipeline does not match what the registered bound assumes.

    The message names the parameter, the constraint, the value found and the fix.
    """


# ---------------------------------------------------------------- registration


@dataclasses.dataclass(frozen=True)
class Registration:
    """What the user declared when registering an accountant name (validated)."""

    name: str
    bound: str
    sampling: Sampling
    relation: Relation
    dataset_size: int
    learning_rate: float
    assumptions: LossAssumptions
    orders: tuple[float, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bound": self.bound,
            "sampling": self.sampling.value,
            "relation": self.relation.value,
            "dataset_size": self.dataset_size,
            "learning_rate": self.learning_rate,
            "assumptions": dataclasses.asdict(self.assumptions),
            "orders": None if self.orders is None else list(self.orders),
        }


_REGISTRATIONS: dict[str, Registration] = {}


def register(
    name: str,
    *,
    bound: str = registry.BEST,
    sampling: str | Sampling,
    dataset_size: int,
    learning_rate: float,
    smoothness: float | None = None,
    weak_convexity: float = 0.0,
    strong_convexity: float = 0.0,
    diameter: float | None = None,
    gradient_norms_within_clip: bool = False,
    relation: str | Relation = Relation.REPLACE_ONE,
    orders: Sequence[float] | None = None,
    force: bool = False,
) -> str:
    r"""Register a pre-configured last-iterate accountant under ``name``.

    Opacus instantiates registered accountants with no arguments, so the
    configuration is bound to the name. Afterwards ``PrivacyEngine(accountant=name)``
    uses it.

    Args:
      name: the mechanism name (``accountant.mechanism()`` returns it).
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``: the
        per-order minimum over every bound that applies, composition included).
      sampling: what the data loader does (cyclic, shuffle_once, reshuffle, poisson);
        checked against the loader.
      dataset_size: n; must equal ``len(data_loader.dataset)``.
      learning_rate: the constant SGD step size; every step must use exactly it.
      smoothness, weak_convexity, strong_convexity, diameter, gradient_norms_within_clip: the loss
        assumptions (see ``LossAssumptions``); ``diameter`` needs
        :func:`attach_projection`.
      relation: the neighbouring relation of the guarantee.
      orders: Renyi orders (default: the library's grid).
      force: replace an existing registration of ``name`` with a different configuration.

    Returns:
      ``name``.

    Raises:
      ValueError: an invalid value, or ``name`` already registered with another
        configuration (or by another accountant) and ``force`` is False.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string. Found {name!r}.")
    if bound not in registry.BOUND_IDS:
        raise ValueError(f"bound must be one of {', '.join(registry.BOUND_IDS)}. Found {bound!r}.")
    sampling = Sampling.parse(sampling)
    relation = Relation.parse(relation)
    assumptions = LossAssumptions(
        smoothness=smoothness,
        weak_convexity=weak_convexity,
        strong_convexity=strong_convexity,
        diameter=diameter,
        gradient_norms_within_clip=gradient_norms_within_clip,
    )
    # TrainingConfig validates dataset_size and learning_rate with the core's messages.
    probe = TrainingConfig(
        dataset_size=dataset_size,
        batch_size=1,
        noise_multiplier=1.0,
        steps=1,
        sampling=sampling,
        learning_rate=learning_rate,
        relation=relation,
    )
    if bound != registry.BEST:
        covered = registry.get_spec(bound).relation_for(sampling)
        if covered is None:
            schemes = ", ".join(s.value for s in registry.BOUNDS[bound].covers)
            raise ValueError(f"sampling must be one of {schemes} for {bound}. Found {sampling.value}.")
        if covered is not relation:
            raise ValueError(
                f"relation must be {covered.value} for {bound} with sampling={sampling.value}. Found {relation.value}."
            )
    if sampling is Sampling.RANDOM_BATCH:
        raise ValueError(
            "sampling must be one of cyclic, shuffle_once, reshuffle, poisson for the Opacus adapter: no PyTorch or "
            "Opacus data loader draws a uniformly random batch of fixed size every step. Found random_batch."
        )
    frozen_orders = None if orders is None else tuple(float(o) for o in validate_orders(orders))
    reg = Registration(
        name=name,
        bound=bound,
        sampling=sampling,
        relation=relation,
        dataset_size=probe.dataset_size,
        learning_rate=float(probe.learning_rate),
        assumptions=assumptions,
        orders=frozen_orders,
    )
    previous = _REGISTRATIONS.get(name)
    if previous is not None and previous == reg:
        return name
    if previous is not None and not force:
        raise ValueError(
            f"accountant name {name!r} is already registered with a different configuration "
            f"({previous.to_dict()}); pass force=True to replace it or choose another name."
        )
    cls = type(
        f"LastIterateAccountant_{name}",
        (LastIterateAccountant,),
        {"_registration": reg, "__module__": __name__, "__doc__": f"Last-iterate accountant {name!r}."},
    )
    register_accountant(name, cls, force=force or previous is not None)
    _REGISTRATIONS[name] = reg
    return name


def registration(name: str) -> Registration:
    """The configuration registered under ``name``."""
    try:
        return _REGISTRATIONS[name]
    except KeyError:
        raise ValueError(f"no last-iterate accountant is registered under {name!r}; call register() first.") from None


# ---------------------------------------------------------------- data loaders and samplers


class ShuffleOnceSampler(Sampler[int]):
    r"""SHUFFLE_ONCE: one random permutation, drawn at construction, reused every epoch.

    ``DataLoader(dataset, batch_size=b, sampler=ShuffleOnceSampler(dataset))``
    gives the same batches in every epoch, in an order the adversary does not
    know. The shuffle-once bound (Ye & Shokri, Thm 4.2) needs the permutation to
    be random and secret: by default the seed comes from the operating system
    (``secrets``); a seed you pass must be kept secret (a public seed makes the
    order public, i.e. cyclic, and then only ``sampling="cyclic"`` is honest).
    Reuse the same seed when resuming from a checkpoint.

    Args:
      data_source: a sized dataset, or the number of examples.
      seed: seed of the permutation (default: a fresh secret one).
    """

    generator = None  # Opacus' secure_mode swaps samplers' generators; the permutation is already drawn

    def __init__(self, data_source: Any, *, seed: int | None = None) -> None:
        size = data_source if isinstance(data_source, numbers.Integral) else len(data_source)
        if isinstance(size, bool) or int(size) < 1:
            raise ValueError(f"data_source must hold at least one example. Found {size!r}.")
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        gen = torch.Generator()
        gen.manual_seed(self.seed)
        self._permutation = tuple(torch.randperm(int(size), generator=gen).tolist())
        self._digest = hashlib.sha256(np.asarray(self._permutation, dtype="<i8").tobytes()).hexdigest()

    @property
    def permutation(self) -> tuple[int, ...]:
        return self._permutation

    @property
    def digest(self) -> str:
        """SHA-256 of the permutation: lets a resumed run check that it uses the same one.
        For a small dataset it reveals the order to whoever reads it: keep it as private as the seed."""
        return self._digest

    def __iter__(self) -> Iterator[int]:
        return iter(self._permutation)

    def __len__(self) -> int:
        return len(self._permutation)


@dataclasses.dataclass(frozen=True)
class LoaderFacts:
    """What a data loader does, as far as the accounting is concerned.

    Attributes:
      sampling: the scheme it implements.
      dataset_size: ``len(loader.dataset)``.
      num_batches: batches per epoch, ``len(loader)`` (for Poisson: round(1 / sample_rate)).
      batch_size: the fixed batch size (None for Poisson).
      sample_rate: the per-example inclusion probability of a Poisson batch (None otherwise).
      distributed: Opacus' distributed Poisson sampler.
      description: the sampler, in words.
      permutation_digest: for a ShuffleOnceSampler, the SHA-256 of its permutation (None otherwise).
    """

    sampling: Sampling
    dataset_size: int
    num_batches: int
    batch_size: int | None
    sample_rate: float | None
    distributed: bool
    description: str
    permutation_digest: str | None = None

    @property
    def opacus_sample_rate(self) -> float:
        """The sample rate Opacus passes to the accountant: q for Poisson, else 1 / len(loader)."""
        return self.sample_rate if self.sample_rate is not None else 1.0 / self.num_batches


def describe_data_loader(loader: Any) -> LoaderFacts:
    r"""Map a data loader to the sampling scheme it implements.

    ==========================================================  ==============
    loader                                                       sampling
    ==========================================================  ==============
    Opacus ``DPDataLoader`` (``make_private(poisson_sampling=True)``),
    also distributed                                             poisson
    ``DataLoader(shuffle=False)`` (``SequentialSampler``)        cyclic
    ``DataLoader(sampler=ShuffleOnceSampler(...))``              shuffle_once
    ``DataLoader(shuffle=True)`` (``RandomSampler``)             reshuffle
    ==========================================================  ==============

    Raises:
      LastIterateConfigurationError: anything else (``drop_last=True`` with a
        fixed-size loader, ``RandomSampler(replacement=True)`` or with
        ``num_samples``, ``DistributedSampler``, weighted or custom samplers,
        iterable datasets), naming the problem and the fix.
    """
    if not isinstance(loader, DataLoader):
        raise LastIterateConfigurationError(f"data_loader must be a torch DataLoader. Found {type(loader).__name__}.")
    if isinstance(loader.dataset, IterableDataset):
        raise LastIterateConfigurationError(
            "data_loader.dataset must be a map-style dataset (its sampling must be known). Found an IterableDataset."
        )
    n = len(loader.dataset)
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, (UniformWithReplacementSampler, DistributedUniformWithReplacementSampler)):
        distributed = isinstance(batch_sampler, DistributedUniformWithReplacementSampler)
        if distributed and batch_sampler.total_size != n:
            raise LastIterateConfigurationError(
                f"the distributed Poisson sampler's total_size must equal len(dataset) = {n}. "
                f"Found {batch_sampler.total_size}."
            )
        return LoaderFacts(
            sampling=Sampling.POISSON,
            dataset_size=n,
            num_batches=max(1, round(1.0 / batch_sampler.sample_rate)),
            batch_size=None,
            sample_rate=float(batch_sampler.sample_rate),
            distributed=distributed,
            description=f"Opacus Poisson sampler (sample_rate={batch_sampler.sample_rate:g})",
        )
    if type(batch_sampler) is not BatchSampler:
        raise LastIterateConfigurationError(
            "data_loader must batch with torch's BatchSampler (DataLoader(batch_size=...)) or Opacus' Poisson sampler. "
            f"Found batch_sampler={type(batch_sampler).__name__}; its sampling scheme cannot be verified."
        )
    sampler = batch_sampler.sampler
    digest = None
    if isinstance(sampler, ShuffleOnceSampler):
        digest = sampler.digest
        sampling, description = Sampling.SHUFFLE_ONCE, "ShuffleOnceSampler (one secret permutation, every epoch)"
        if len(sampler) != n:
            raise LastIterateConfigurationError(
                f"ShuffleOnceSampler must cover the whole dataset: len(sampler) must be {n}. Found {len(sampler)}."
            )
    elif type(sampler) is SequentialSampler:
        sampling, description = Sampling.CYCLIC, "SequentialSampler (DataLoader(shuffle=False): fixed order)"
    elif type(sampler) is RandomSampler:
        if sampler.replacement or sampler.num_samples != n:
            raise LastIterateConfigurationError(
                "RandomSampler must draw a permutation of the whole dataset (replacement=False, num_samples=None): "
                f"no bound covers sampling with replacement. Found replacement={sampler.replacement}, "
                f"num_samples={sampler.num_samples} for {n} examples."
            )
        sampling, description = (
            Sampling.RESHUFFLE,
            "RandomSampler (DataLoader(shuffle=True): new permutation every epoch)",
        )
    elif isinstance(sampler, DistributedSampler):
        raise LastIterateConfigurationError(
            "DistributedSampler is not supported (it pads the dataset by repeating examples and its epochs depend on "
            "set_epoch calls). For distributed training use make_private(poisson_sampling=True), sampling='poisson'."
        )
    else:
        raise LastIterateConfigurationError(
            f"sampler must be SequentialSampler, RandomSampler or ShuffleOnceSampler. Found {type(sampler).__name__}; "
            "its sampling scheme cannot be verified, so no bound can be applied honestly."
        )
    if batch_sampler.drop_last:
        raise LastIterateConfigurationError(
            f"drop_last must be False for sampling={sampling.value}: every bound counts a pass as ceil(n/b) batches "
            "normalised by b, and dropping the short last batch changes which examples each pass uses. "
            "Found drop_last=True."
        )
    return LoaderFacts(
        sampling=sampling,
        dataset_size=n,
        num_batches=len(loader),
        batch_size=int(batch_sampler.batch_size),
        sample_rate=None,
        distributed=False,
        description=description,
        permutation_digest=digest,
    )


_FIXES = {
    Sampling.CYCLIC: "DataLoader(shuffle=False)",
    Sampling.SHUFFLE_ONCE: "DataLoader(sampler=ShuffleOnceSampler(dataset)) with make_private(poisson_sampling=False)",
    Sampling.RESHUFFLE: "DataLoader(shuffle=True) with make_private(poisson_sampling=False)",
    Sampling.POISSON: "make_private(poisson_sampling=True)",
}


def check_data_loader(loader: Any, sampling: str | Sampling, dataset_size: int | None = None) -> LoaderFacts:
    """Check that ``loader`` (the one actually iterated: the one ``make_private`` returns)
    implements the declared ``sampling``; return its :class:`LoaderFacts`.

    Raises:
      LastIterateConfigurationError: the loader contradicts the declaration
        (message: what was declared, what the loader does, how to fix either).
    """
    sampling = Sampling.parse(sampling)
    facts = describe_data_loader(loader)
    if facts.sampling is not sampling:
        raise LastIterateConfigurationError(
            f"sampling was declared {sampling.value!r} but the data loader implements {facts.sampling.value!r} "
            f"({facts.description}). Use {_FIXES.get(sampling, 'a loader implementing it')} for "
            f"{sampling.value}, or register the accountant with sampling={facts.sampling.value!r}."
        )
    if dataset_size is not None and facts.dataset_size != dataset_size:
        raise LastIterateConfigurationError(
            f"dataset_size must equal len(data_loader.dataset) = {facts.dataset_size}. Found {dataset_size} registered."
        )
    return facts


# ---------------------------------------------------------------- projection


class Projection:
    r"""Joint projection of the trainable parameters onto an l2 ball.

    After every step of the optimizer it is attached to, the vector of all
    trainable parameters x is replaced by ``center + (x - center) * min(1, r / |x - center|)``
    with radius r = diameter / 2: the Euclidean projection onto a ball of the given
    diameter (a closed convex set), as the bounded-domain bounds assume.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, diameter: float, center: Sequence[torch.Tensor] | None):
        self.diameter = float(diameter)
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("the optimizer must have at least one trainable parameter to project. Found none.")
        if center is None:
            self.center = [torch.zeros_like(p) for p in self.params]
        else:
            center = list(center)
            if len(center) != len(self.params) or any(
                c.shape != p.shape for c, p in zip(center, self.params, strict=False)
            ):
                raise ValueError(
                    "center must hold one tensor per trainable parameter, with the same shapes. "
                    f"Found {len(center)} tensors for {len(self.params)} parameters."
                )
            self.center = [
                c.detach().clone().to(device=p.device, dtype=p.dtype) for c, p in zip(center, self.params, strict=False)
            ]
        self._handle = optimizer.register_step_post_hook(lambda *_: self.apply())
        self._optimizer = weakref.ref(optimizer)

    def _distance(self) -> float:
        squares = [torch.sum((p - c).double() ** 2).to("cpu") for p, c in zip(self.params, self.center, strict=True)]
        return math.sqrt(float(sum(squares)))

    @torch.no_grad()
    def apply(self) -> None:
        """Project the parameters in place (a no-op inside the ball).

        The norm is computed in float64, and the shrink factor keeps a relative margin
        of max(1e-6, 2 eps(dtype)) (like TF Privacy's projection) so that rounding the
        result to the parameters' dtype cannot leave it outside the ball; the result is
        checked and shrunk again if rounding still did.
        """
        radius = self.diameter / 2.0
        eps = max(torch.finfo(p.dtype).eps if p.is_floating_point() else 0.0 for p in self.params)
        margin = max(1e-6, 2.0 * eps)
        for _ in range(8):
            norm = self._distance()
            if norm <= radius:
                return
            scale = radius * (1.0 - margin) / norm
            for p, c in zip(self.params, self.center, strict=True):
                p.copy_(c + (p - c) * scale)
            margin *= 4.0
        norm = self._distance()
        if norm > radius:
            raise RuntimeError(
                f"the projection must leave the parameters within radius {radius:g}; rounding to their dtype leaves "
                f"them at distance {norm:.9g}. Use float32 or float64 parameters."
            )

    def covers(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether it projects exactly the trainable parameters of ``optimizer``."""
        current = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
        return self._optimizer() is optimizer and current == {id(p) for p in self.params}

    def remove(self) -> None:
        """Detach the projection from its optimizer."""
        self._handle.remove()
        optimizer = self._optimizer()
        if optimizer is not None and _PROJECTIONS.get(optimizer) is self:
            del _PROJECTIONS[optimizer]


_PROJECTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _base_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return optimizer.original_optimizer if isinstance(optimizer, DPOptimizer) else optimizer


def attach_projection(
    optimizer: torch.optim.Optimizer, diameter: float, center: Sequence[torch.Tensor] | None = None
) -> Projection:
    r"""Project all trainable parameters jointly onto the l2 ball of ``diameter``
    (centred at ``center``, default the origin) after every optimizer step, and
    once now (so the starting point lies in the domain too).

    Works on the torch optimizer or on the DPOptimizer wrapping it (the hook goes on
    the wrapped ``torch.optim`` optimizer, which performs the step). Attaching again
    replaces the previous projection. The accountant checks, at every step, that a
    projection of diameter <= the declared one covers exactly the parameters of the
    optimizer it accounts for.
    """
    if isinstance(diameter, bool) or not isinstance(diameter, numbers.Real) or not (0 < diameter < math.inf):
        raise ValueError(f"diameter must be a finite number > 0. Found {diameter!r}.")
    base = _base_optimizer(optimizer)
    previous = _PROJECTIONS.get(base)
    projection = Projection(base, diameter, center)
    if previous is not None:
        previous.remove()
    _PROJECTIONS[base] = projection
    projection.apply()
    return projection


# ---------------------------------------------------------------- observation of the optimizer


@dataclasses.dataclass(frozen=True)
class _Observed:
    """What one optimizer step does, in Opacus' terms and in the core's terms."""

    noise_multiplier: float
    clip_norm: float
    loss_reduction: str
    normaliser: float  # N: the noisy sum is divided by N
    accumulated_iterations: int
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
    def from_dict(cls, data: Mapping[str, Any]) -> _Observed:
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {"permutation_digest": None, **data}  # checkpoints of format 1 have none
        if set(data) != fields:
            raise ValueError(f"observation must have the keys {sorted(fields)}. Found {sorted(data)}.")
        return cls(**data)


def _poisson_batch_size(n: int, sample_rate: float) -> int:
    """b with b/n >= the Poisson sample rate (exact when n * q is an integer)."""
    batches = round(1.0 / sample_rate)
    if batches >= 1 and math.isclose(1.0 / batches, sample_rate, rel_tol=1e-12, abs_tol=0.0):
        return min(n, -(-n // batches))  # q = 1/L exactly: b = ceil(n / L)
    return min(n, math.ceil(n * sample_rate))


def _check_sgd(optimizer: Any, reg: Registration) -> float:
    """Plain constant-step SGD with the registered learning rate; returns it."""
    if type(optimizer) is not torch.optim.SGD:
        raise LastIterateConfigurationError(
            "the optimizer must be plain torch.optim.SGD (the bounds analyse x - lr * noisy gradient). "
            f"Found {type(optimizer).__name__}. Adaptive or momentum methods are not covered by any bound."
        )
    for i, group in enumerate(optimizer.param_groups):
        for key, neutral in (("momentum", 0), ("weight_decay", 0), ("nesterov", False), ("maximize", False)):
            value = group.get(key, neutral)
            value = value.item() if torch.is_tensor(value) else value
            if value != neutral:
                hint = (
                    " Fold weight decay into the loss as an l2 regulariser (and declare its strong convexity) instead."
                    if key == "weight_decay"
                    else ""
                )
                raise LastIterateConfigurationError(
                    f"{key} must be {neutral} for a last-iterate bound (plain SGD). Found {key}={value} in "
                    f"param_groups[{i}].{hint}"
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


def _check_dp_optimizer(optim: Any, reg: Registration) -> None:
    """The static part: DPOptimizer type, flat clipping, plain SGD inside."""
    if type(optim) not in _ALLOWED_OPTIMIZERS:
        raise LastIterateConfigurationError(
            "the DP optimizer must be Opacus' DPOptimizer or DistributedDPOptimizer (clipping='flat', "
            f"grad_sample_mode 'hooks'). Found {type(optim).__name__}; per-layer, adaptive and ghost clipping are "
            "not supported by this adapter."
        )
    clip = optim.max_grad_norm
    if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not (0 < clip < math.inf):
        raise LastIterateConfigurationError(f"max_grad_norm must be a single finite number > 0. Found {clip!r}.")
    if optim.loss_reduction not in ("mean", "sum"):
        raise LastIterateConfigurationError(f"loss_reduction must be 'mean' or 'sum'. Found {optim.loss_reduction!r}.")
    _check_sgd(optim.original_optimizer, reg)


def _core_batch(reg: Registration, facts: LoaderFacts, accumulated: int) -> int:
    """b of the core: the largest logical batch."""
    if facts.sampling is Sampling.POISSON:
        if accumulated != 1:
            raise LastIterateConfigurationError(
                "accumulated_iterations must be 1 with Poisson sampling (several Poisson batches in one step are not "
                f"a Poisson batch). Found {accumulated}. Use BatchMemoryManager to split a logical batch instead."
            )
        return _poisson_batch_size(reg.dataset_size, facts.sample_rate)
    if facts.num_batches % accumulated:
        raise LastIterateConfigurationError(
            f"accumulated_iterations must divide the number of batches per epoch len(data_loader) = "
            f"{facts.num_batches} for sampling={facts.sampling.value} (every logical batch must lie inside one "
            f"epoch, with the same batches every epoch). Found {accumulated}."
        )
    return min(reg.dataset_size, facts.batch_size * accumulated)


def _observe(optim: Any, reg: Registration, facts: LoaderFacts) -> _Observed:
    """Validate one DPOptimizer step and express it in the core's terms."""
    _check_dp_optimizer(optim, reg)
    accumulated = int(optim.accumulated_iterations)
    world = int(getattr(optim, "world_size", 1)) if isinstance(optim, DistributedDPOptimizer) else 1
    if facts.distributed != isinstance(optim, DistributedDPOptimizer):
        raise LastIterateConfigurationError(
            "the data loader and the optimizer must agree on distribution: a distributed Poisson loader needs "
            "DistributedDPOptimizer and vice versa (wrap the model in DPDDP before make_private). "
            f"Found loader distributed={facts.distributed}, optimizer {type(optim).__name__}."
        )
    mean = optim.loss_reduction == "mean"
    normaliser = float(optim.expected_batch_size) * accumulated * world if mean else 1.0
    b = _core_batch(reg, facts, accumulated)
    if facts.batch_size is not None:  # fixed batches: no physical batch may exceed the loader's
        _check_physical_batches(optim, facts.batch_size)
    noise = optim.noise_multiplier
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not (0 < noise < math.inf):
        raise LastIterateConfigurationError(f"noise_multiplier must be a finite number > 0. Found {noise!r}.")
    sample_rate = facts.opacus_sample_rate
    return _Observed(
        noise_multiplier=float(noise),
        clip_norm=float(optim.max_grad_norm),
        loss_reduction=optim.loss_reduction,
        normaliser=normaliser,
        accumulated_iterations=accumulated,
        sampling=facts.sampling.value,
        loader_batches=facts.num_batches,
        loader_batch_size=facts.batch_size,
        sample_rate=sample_rate,
        batch_size=b,
        learning_rate=reg.learning_rate * b / normaliser,
        permutation_digest=facts.permutation_digest,
    )


def _check_physical_batches(optim: Any, batch_size: int) -> None:
    """No physical batch of this step (per-sample gradients of the first trainable
    parameter, as in ``optim.params[0]``) may hold more than ``batch_size`` examples."""
    for group in optim.original_optimizer.param_groups:  # = optim.param_groups, without the property call
        for p in group["params"]:
            if not p.requires_grad:
                continue
            samples = getattr(p, "grad_sample", None)
            for g in samples if isinstance(samples, list) else [samples]:
                if g is not None and g.shape[0] > batch_size:
                    raise LastIterateConfigurationError(
                        f"every batch must hold at most the data loader's batch_size = {batch_size} examples. "
                        f"Found a batch of {g.shape[0]}: train on the data loader returned by make_private."
                    )
            return


# exact types whose objects are immutable: while an attribute or param-group entry still
# refers to the same object of one of these types, its value has not changed
_IMMUTABLE_TYPES = frozenset((int, float, bool, str, type(None)))
_NOT_SET = object()  # what a missing param-group entry reads as


def _group_values(group: Mapping[str, Any]) -> tuple:
    """The param-group entries :func:`_check_sgd` reads (defaults as there)."""
    get = group.get
    momentum, decay, nesterov = get("momentum", 0), get("weight_decay", 0), get("nesterov", False)
    return momentum, decay, nesterov, get("maximize", False), get("lr", _NOT_SET)


def _snapshot(optim: Any) -> tuple | None:
    """The objects :func:`_observe` reads from ``optim``, besides ``accumulated_iterations``
    and the per-sample gradients, for :func:`_unchanged`; None when one of them is not an
    immutable plain value (a tensor learning rate can change in place) or is NaN, so that
    every step is checked in full. Call only after :func:`_observe` accepted ``optim``."""
    kind = type(optim)
    reduction = optim.loss_reduction
    expected = optim.expected_batch_size if reduction == "mean" else None
    world = getattr(optim, "world_size", 1) if kind is DistributedDPOptimizer else 1
    groups = tuple(_group_values(group) for group in optim.original_optimizer.param_groups)
    values = (optim.max_grad_norm, optim.noise_multiplier, reduction, expected, world, *(v for g in groups for v in g))
    if not all(type(v) in _IMMUTABLE_TYPES and v == v for v in values):
        return None
    return kind, optim.max_grad_norm, reduction, groups, expected, world, optim.noise_multiplier


def _unchanged(optim: Any, snapshot: tuple) -> bool:
    """Whether ``optim`` still holds the very objects of ``snapshot`` (a false "changed"
    only costs a full check). Reads in :func:`_observe`'s order; a missing attribute
    or entry (SGD always sets them) counts as changed."""
    kind, clip, reduction, groups, expected, world, noise = snapshot
    if type(optim) is not kind:
        return False
    try:
        if optim.max_grad_norm is not clip or optim.loss_reduction is not reduction:
            return False
        base = optim.original_optimizer
        if type(base) is not torch.optim.SGD:
            return False
        current = base.param_groups
        if len(current) != len(groups):
            return False
        for group, (momentum, decay, nesterov, maximize, lr) in zip(current, groups, strict=True):
            if (
                group["lr"] is not lr
                or group["momentum"] is not momentum
                or group["weight_decay"] is not decay
                or group["nesterov"] is not nesterov
                or group["maximize"] is not maximize
            ):
                return False
        if kind is DistributedDPOptimizer and getattr(optim, "world_size", 1) is not world:
            return False
        if expected is not None and optim.expected_batch_size is not expected:
            return False
        return optim.noise_multiplier is noise
    except (AttributeError, KeyError, TypeError):  # the full check raises what it raises
        return False


def _current_examples(optim: Any) -> int:
    """Examples in the per-sample gradients of the step being taken (its physical batches)."""
    for p in optim.params:
        samples = getattr(p, "grad_sample", None)
        if samples is not None:
            return sum(int(g.shape[0]) for g in (samples if isinstance(samples, list) else [samples]))
    return 0


def _check_projection(optim: Any, reg: Registration) -> None:
    diameter = reg.assumptions.diameter
    if diameter is None:
        return
    base = _base_optimizer(optim)
    projection = _PROJECTIONS.get(base)
    if projection is None or not projection.covers(base):
        raise LastIterateConfigurationError(
            f"diameter={diameter:g} was declared for accountant {reg.name!r}, so every step must project all trainable "
            "parameters onto a ball of that diameter. Found no projection covering exactly the parameters of this "
            "optimizer. Call lastiter_plugins.adapters.opacus.attach_projection(optimizer, diameter) or register "
            "without a diameter."
        )
    if projection.diameter > diameter:
        raise LastIterateConfigurationError(
            f"the projection's diameter must be <= the declared diameter {diameter:g}. Found {projection.diameter:g}."
        )


# ---------------------------------------------------------------- reading Opacus' call (read-only)


def _engine_locals(method: str, depth: int = 12) -> dict[str, Any] | None:
    """Locals of the innermost running ``PrivacyEngine.<method>`` frame (Opacus 1.6), or None.

    Matched by code object identity, so only Opacus' own method matches. Only
    reads a few arguments; nothing is written and no frame is kept.
    """
    target = getattr(PrivacyEngine, method).__code__
    frame = sys._getframe(1)
    try:
        for _ in range(depth):
            if frame is None:
                return None
            if frame.f_code is target:
                return dict(frame.f_locals)
            frame = frame.f_back
        return None
    finally:
        del frame


@dataclasses.dataclass(frozen=True)
class _Binding:
    facts: LoaderFacts
    # set when make_private was called by make_private_with_epsilon: (target_epsilon, target_delta, epochs)
    plan: tuple[float, float, int] | None = None
    # weak reference to the loader's batch sampler (what BatchMemoryManager splits)
    batch_sampler: Any = None


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


def _batch_sizes(value: Any, dim: int, depth: int = 0) -> Iterator[int]:
    """Sizes along ``dim`` of the tensors in a forward call's (nested) arguments."""
    if torch.is_tensor(value):
        if value.dim() > dim:
            yield int(value.shape[dim])
    elif depth < 4 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _batch_sizes(item, dim, depth + 1)
    elif depth < 4 and isinstance(value, Mapping):
        for item in value.values():
            yield from _batch_sizes(item, dim, depth + 1)


class _ExampleCounter:
    """Counts the examples entering the private module in forward passes that record
    per-sample gradients (training mode, gradients enabled) since the last real step.

    A forward pre-hook that only reads the arguments. The batch size of a call is the
    largest size along the batch dimension among its tensors (an upper bound when some
    inputs are not batched); a call without such a tensor makes the count unknown.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self.unknown = False
        self._dim = 0 if getattr(module, "batch_first", True) else 1
        self._module = weakref.ref(module)
        self._handle = module.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return None  # Opacus records no per-sample gradients for this call
        if not kwargs and len(args) == 1 and isinstance(args[0], torch.Tensor):  # the usual model(x): no generators
            batch = args[0]
            if batch.dim() > self._dim:
                self.count += int(batch.shape[self._dim])
            else:
                self.unknown = True
            return None
        sizes = list(_batch_sizes((args, kwargs), self._dim))
        if sizes:
            self.count += max(sizes)
        else:
            self.unknown = True
        return None

    def reset(self) -> None:
        self.count = 0
        self.unknown = False

    def watches(self, module: Any) -> bool:
        return self._module is not None and self._module() is module

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()

    def __getstate__(self) -> dict[str, Any]:
        # pickling or copying the model (torch.save(model)) carries a detached counter
        return {"count": 0, "unknown": False, "_dim": self._dim, "_module": None, "_handle": None}


# ---------------------------------------------------------------- report


@dataclasses.dataclass(frozen=True)
class ReportRow:
    bound: str
    relation: str | None
    applies: bool
    epsilon: float | None
    order: float | None
    protects: str
    reasons: tuple[str, ...]  # why it does not apply (for ``best``: which bound attains it)
    reference: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Report:
    """Every bound, side by side, for the steps taken so far."""

    name: str
    delta: float
    steps: int
    sampling: str
    relation: str
    rows: tuple[ReportRow, ...]
    threat_model: str = THREAT_MODEL

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "delta": self.delta,
            "steps": self.steps,
            "sampling": self.sampling,
            "relation": self.relation,
            "rows": [r.to_dict() for r in self.rows],
            "threat_model": self.threat_model,
        }

    def __str__(self) -> str:
        head = (
            f"accountant {self.name!r}: {self.steps} steps, sampling {self.sampling}, delta {self.delta:g}, "
            f"declared relation {self.relation}"
        )
        table = [("bound", "relation", "epsilon", "order", "protects", "applies / why not")]
        for r in self.rows:
            eps = "-" if r.epsilon is None else f"{r.epsilon:.4g}"
            order = "-" if r.order is None else f"{r.order:g}"
            why = "yes" if r.applies else r.reasons[0]
            if r.applies and r.reasons:
                why = r.reasons[0]
            elif len(r.reasons) > 1:
                why += f" (+{len(r.reasons) - 1} more)"
            table.append((r.bound, r.relation or "-", eps, order, r.protects if r.applies else "-", why))
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        lines = [head]
        for row in table:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)) + "  " + row[5])
        lines.append(self.threat_model)
        return "\n".join(lines)


# ---------------------------------------------------------------- the accountant


def _merge_step(history: list, noise_multiplier: float, sample_rate: float) -> None:
    """Append one step to an Opacus-format history [(noise_multiplier, sample_rate, steps)]."""
    if history and history[-1][0] == noise_multiplier and history[-1][1] == sample_rate:
        z, q, steps = history[-1]
        history[-1] = (z, q, steps + 1)
    else:
        history.append((noise_multiplier, sample_rate, 1))


class LastIterateAccountant(IAccountant):
    """Opacus accountant computing a last-iterate epsilon with ``lastiter_plugins``.

    Do not instantiate this base class: :func:`register` creates a configured
    subclass per name. ``history`` keeps Opacus' format
    ``[(noise_multiplier, sample_rate, num_steps)]`` so that Opacus' calibration
    (``make_private_with_epsilon``) can drive it.
    """

    _registration: Registration | None = None
    _steady: tuple | None = None  # see _account_step (class default: accountants pickled before it existed)

    def __init__(self) -> None:
        if self._registration is None:
            raise TypeError(
                "use lastiter_plugins.adapters.opacus.register(name, ...) and PrivacyEngine(accountant=name)"
            )
        super().__init__()
        self.history: list[tuple[float, float, int]] = []
        self._observed: _Observed | None = None
        self._binding: _Binding | None = None
        self._resumed = False
        self._counter: _ExampleCounter | None = None
        self._splitter: Any = None  # weak reference to the BatchMemoryManager sampler found for Poisson batches
        # set by a fully checked step after which the next one needs only the per-step checks:
        # (binding, _snapshot of the optimizer, loader batch size, noise multiplier, recorded sample rate)
        self._steady: tuple | None = None

    # -- IAccountant
    @classmethod
    def mechanism(cls) -> str:
        return cls._registration.name if cls._registration is not None else "lastiter"

    @property
    def registration(self) -> Registration:
        return self._registration

    def __len__(self) -> int:
        return len(self.history)

    @property
    def steps(self) -> int:
        """Optimizer steps accounted for so far."""
        return int(sum(entry[2] for entry in self.history))

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        _merge_step(self.history, float(noise_multiplier), float(sample_rate))

    def bind_data_loader(self, data_loader: Any, module: torch.nn.Module | None = None) -> LoaderFacts:
        """Declare the data loader the training loop iterates (the one returned by
        ``make_private``) and, for ``signal_skip_step`` / ``BatchMemoryManager`` with
        a fixed-size loader, the private module (``GradSampleModule``) the loop calls.
        Needed only when the optimizer hook was not created by Opacus'
        ``PrivacyEngine.make_private`` (which the accountant reads itself)."""
        reg = self._registration
        facts = check_data_loader(data_loader, reg.sampling, reg.dataset_size)
        self._bind(facts, None, data_loader, module)
        return facts

    def _bind(self, facts: LoaderFacts, plan: Any, data_loader: Any, module: Any) -> None:
        if module is not None and not isinstance(module, torch.nn.Module):
            raise LastIterateConfigurationError(f"module must be a torch.nn.Module. Found {type(module).__name__}.")
        if self._resumed and self._observed is not None:
            self._check_permutation(self._observed.permutation_digest, facts.permutation_digest)
        self._binding = _Binding(facts, plan, _weak(data_loader.batch_sampler))
        self._steady = None
        self._splitter = None
        if self._counter is not None and not self._counter.watches(module):
            self._counter.remove()
            self._counter = None
        if module is not None and self._counter is None:
            self._counter = _ExampleCounter(module)
        if self._counter is not None:
            self._counter.reset()

    def _check_permutation(self, saved: str | None, current: str | None) -> None:
        if saved != current:
            raise LastIterateConfigurationError(
                f"a run with sampling={self._registration.sampling.value} must resume with the same permutation: the "
                "shuffle-once bound assumes one permutation for the whole run. Found a ShuffleOnceSampler whose "
                f"permutation differs from the checkpoint's (digest {str(current)[:12]} vs {str(saved)[:12]}). "
                "Build the ShuffleOnceSampler with the seed of the interrupted run."
            )

    def get_optimizer_hook_fn(self, sample_rate: float):
        reg = self._registration
        caller = _engine_locals("make_private")
        if caller is not None:  # validate at make_private time
            facts = check_data_loader(caller["data_loader"], reg.sampling, reg.dataset_size)
            if not math.isclose(facts.opacus_sample_rate, sample_rate, rel_tol=1e-9):
                raise LastIterateConfigurationError(
                    f"sample_rate must be {facts.opacus_sample_rate:g} for this data loader. Found {sample_rate:g}."
                )
            _check_dp_optimizer(caller["optimizer"], reg)
            plan = None
            outer = _engine_locals("make_private_with_epsilon")
            if outer is not None:
                plan = (float(outer["target_epsilon"]), float(outer["target_delta"]), int(outer["epochs"]))
            module = caller.get("module")
            self._bind(facts, plan, caller["data_loader"], module if isinstance(module, torch.nn.Module) else None)

        def hook_fn(optim: DPOptimizer) -> None:
            self._account_step(optim)

        return hook_fn

    def _account_step(self, optim: Any) -> None:
        """Validate the step about to be taken, then record it (nothing is recorded on refusal).

        After a fully checked step that was not resumed, projected or accumulated, a step
        whose optimizer still holds the same objects (:func:`_unchanged`) with the same
        binding and one accumulated batch would pass every check that reads only them
        and would observe the same configuration, so only the checks of this step's
        data run: the physical batch sizes (the full path's only remaining check) and
        the skip flag (a skipped step takes the full path)."""
        steady = self._steady
        if (
            steady is not None
            and steady[0] is self._binding
            and _unchanged(optim, steady[1])
            and int(optim.accumulated_iterations) == 1
            and not getattr(optim, "_is_last_step_skipped", False)
        ):
            if steady[2] is not None:
                _check_physical_batches(optim, steady[2])
            if self._counter is not None:
                self._counter.reset()
            _merge_step(self.history, steady[3], steady[4])  # what step() does (not overridden: see below)
            return
        self._steady = None
        reg = self._registration
        if self._binding is None:
            raise LastIterateConfigurationError(
                f"accountant {reg.name!r} has not seen the data loader, so the declared sampling={reg.sampling.value} "
                "cannot be verified. Create the optimizer with Opacus' PrivacyEngine.make_private, or call "
                "engine.accountant.bind_data_loader(data_loader) before training."
            )
        observed = _observe(optim, reg, self._binding.facts)
        snapshot = _snapshot(optim)
        if reg.assumptions.diameter is not None:
            _check_projection(optim, reg)
        if getattr(optim, "_is_last_step_skipped", False):  # set by a skipped step, cleared after this hook
            self._check_skipped_steps(optim, observed)
        if observed.accumulated_iterations != 1:
            self._check_whole_batches(observed)
        if self._resumed and self._observed is not None:
            self._check_permutation(self._observed.permutation_digest, observed.permutation_digest)
        if self._observed is not None and observed != self._observed:
            changed = [
                f"{k}: {getattr(self._observed, k)!r} -> {getattr(observed, k)!r}"
                for k in observed.to_dict()
                if getattr(observed, k) != getattr(self._observed, k)
            ]
            raise LastIterateConfigurationError(
                f"the training configuration must stay constant for a last-iterate bound (step {self.steps + 1}). "
                f"Found a change in {'; '.join(changed)}. Noise, clipping, batch and step-size schedules are not "
                "covered; start a new accountant for a new configuration."
            )
        if self._resumed and Sampling(observed.sampling) in _EPOCH_SCHEMES:
            per_epoch = math.ceil(reg.dataset_size / observed.batch_size)
            if self.steps % per_epoch:
                raise LastIterateConfigurationError(
                    f"a run with sampling={observed.sampling} must resume at an epoch boundary (a restarted data "
                    f"loader would reuse the examples of the interrupted epoch). Found {self.steps} steps, "
                    f"{per_epoch} per epoch. Save checkpoints at the end of epochs."
                )
        if self._observed is None and self._binding.plan is not None:
            self._check_plan(observed, self._binding.plan)
        self._observed = observed
        self._resumed = False
        if self._counter is not None:
            self._counter.reset()
        sample_rate = observed.sample_rate * observed.accumulated_iterations
        self.step(noise_multiplier=observed.noise_multiplier, sample_rate=sample_rate)
        if (
            snapshot is not None
            and reg.assumptions.diameter is None
            and observed.accumulated_iterations == 1
            and type(self).step is LastIterateAccountant.step
        ):
            self._steady = (self._binding, snapshot, self._binding.facts.batch_size, float(observed.noise_multiplier),
                            float(sample_rate))  # fmt: skip

    def _check_skipped_steps(self, optim: Any, observed: _Observed) -> None:
        """This step also sums the clipped gradients of steps skipped with ``signal_skip_step``:
        accept it only when they are pieces of the same logical batch (BatchMemoryManager)."""
        problem = (
            "signal_skip_step(True) makes Opacus sum the clipped gradients of several optimizer.step() calls into one "
            "noisy step divided by one batch; summing several data-loader batches that way is not a step any bound "
            "covers (each step would use k batches with an effective step size k * lr)."
        )
        fix = (
            "Use BatchMemoryManager(data_loader=..., optimizer=...) only to split one batch of the make_private "
            "loader, or accumulate without skip signals (several backward() calls, then one step, which the "
            "accountant counts)."
        )
        if Sampling(observed.sampling) is Sampling.POISSON:
            if not self._from_batch_memory_manager(optim):
                raise LastIterateConfigurationError(
                    f"{problem} With sampling=poisson, skipped steps are accepted only from Opacus' BatchMemoryManager "
                    "splitting a Poisson batch of the make_private data loader for this optimizer. Found skipped steps "
                    f"and no such BatchMemoryManager. {fix}"
                )
            return
        counter = self._counter
        if counter is None:
            raise LastIterateConfigurationError(
                f"{problem} The accountant cannot count the examples of this step: it was not given the private "
                "module. Found skipped steps. Create the optimizer with PrivacyEngine.make_private, or call "
                "engine.accountant.bind_data_loader(data_loader, module=model) before training."
            )
        if counter.unknown:
            raise LastIterateConfigurationError(
                f"{problem} The accountant counts examples from the model's tensor inputs, and a training forward call "
                "since the last step had no tensor argument with a batch dimension. Found skipped steps. Pass the "
                f"batch as tensors. {fix}"
            )
        current = _current_examples(optim)
        if counter.count < current:
            raise LastIterateConfigurationError(
                f"{problem} The accountant counts the examples entering the module returned by make_private (or bound "
                f"with bind_data_loader), but this step holds per-sample gradients of {current} examples and only "
                f"{counter.count} entered that module since the last step. Call the private module itself, not the "
                f"module it wraps. {fix}"
            )
        if counter.count > observed.batch_size:
            raise LastIterateConfigurationError(
                f"{problem} The examples summed into one step must be at most the logical batch b = "
                f"{observed.batch_size} (data-loader batch_size = {observed.loader_batch_size} x "
                f"{observed.accumulated_iterations} accumulated backward passes). Found {counter.count} examples "
                f"entering the model in training forward passes since the last step. {fix}"
            )

    def _check_whole_batches(self, observed: _Observed) -> None:
        """k accumulated backward passes are accounted as k whole loader batches (b = k B):
        refuse fewer examples than that (pieces of one batch are not k batches)."""
        counter, batch = self._counter, observed.loader_batch_size
        k = observed.accumulated_iterations
        if counter is None or batch is None or k == 1:
            return
        last = self._registration.dataset_size - (observed.loader_batches - 1) * batch  # short last batch
        least = (k - 1) * batch + last
        if counter.count < least:
            raise LastIterateConfigurationError(
                f"each of the accumulated_iterations = {k} backward passes of a step must be a whole data-loader "
                f"batch (the step is accounted as b = {observed.batch_size} examples, at least {least} even at the end "
                f"of an epoch). Found {counter.count} examples entering the model in training forward passes since "
                "the last step: pieces of one batch are not several batches. Call backward() once per loader batch, "
                "or use BatchMemoryManager to split a batch."
            )

    def _from_batch_memory_manager(self, optim: Any) -> bool:
        """Whether a BatchMemoryManager sampler splits the bound loader's batches for ``optim``
        (found once by scanning the live objects, then remembered by weak reference)."""
        binding_sampler = self._binding.batch_sampler() if self._binding.batch_sampler is not None else None
        if binding_sampler is None:
            return False

        def splits(obj: Any) -> bool:
            return type(obj) is BatchSplittingSampler and obj.optimizer is optim and obj.sampler is binding_sampler

        found = self._splitter() if self._splitter is not None else None
        if found is not None and splits(found):
            return True
        for obj in gc.get_objects():
            if splits(obj):
                self._splitter = weakref.ref(obj)
                return True
        return False

    def _check_plan(self, observed: _Observed, plan: tuple[float, float, int]) -> None:
        """The run make_private_with_epsilon calibrated for must still reach its target."""
        target_epsilon, target_delta, epochs = plan
        if Sampling(observed.sampling) is Sampling.POISSON:
            steps = epochs * observed.loader_batches
        else:
            steps = epochs * (observed.loader_batches // observed.accumulated_iterations)
        config = self._config(observed, observed.noise_multiplier, steps)
        eps = self._compute(config, target_delta).epsilon
        if eps > target_epsilon:
            raise LastIterateConfigurationError(
                f"epsilon after the planned {epochs} epochs must be <= target_epsilon = {target_epsilon:g} as "
                f"make_private_with_epsilon calibrated, but the run observed at the first step (batch_size="
                f"{observed.batch_size}, learning_rate={observed.learning_rate:g}, accumulated_iterations="
                f"{observed.accumulated_iterations}, {steps} steps) would give epsilon = {eps:.6g}. Calibrate with "
                "lastiter_plugins.calibrate_noise and call make_private instead."
            )

    # -- epsilon
    def _config(self, observed: _Observed, noise_multiplier: float, steps: int) -> TrainingConfig:
        reg = self._registration
        return TrainingConfig(
            dataset_size=reg.dataset_size,
            batch_size=observed.batch_size,
            noise_multiplier=noise_multiplier,
            steps=steps,
            sampling=reg.sampling,
            learning_rate=observed.learning_rate,
            clip_norm=observed.clip_norm,
            relation=reg.relation,
        )

    def _compute(self, config: TrainingConfig, delta: float, bound: str | None = None) -> EpsilonResult:
        reg = self._registration
        orders = None if reg.orders is None else np.array(reg.orders)
        return compute_epsilon(bound or reg.bound, config, reg.assumptions, delta, orders)

    def _history_noise(self) -> float:
        noises = {entry[0] for entry in self.history}
        rates = {entry[1] for entry in self.history}
        if len(noises) > 1 or len(rates) > 1:
            raise LastIterateConfigurationError(
                "noise_multiplier and sample_rate must be constant over the run for a last-iterate bound. "
                f"Found noise multipliers {sorted(noises)} and sample rates {sorted(rates)} in the history."
            )
        return float(next(iter(noises)))

    def _predicted(self) -> tuple[_Observed, int]:
        """What the run will do, before any step, from Opacus' make_private_with_epsilon call:
        the optimizer facts and the planned number of steps."""
        reg = self._registration
        call = _engine_locals("make_private_with_epsilon")
        if call is None:
            raise LastIterateConfigurationError(
                f"accountant {reg.name!r} has not seen an optimizer step, and this call does not come from "
                "PrivacyEngine.make_private_with_epsilon, so the batch size, clipping norm and loss reduction are "
                "unknown. Train first, or calibrate with lastiter_plugins.calibrate_noise(...)."
            )
        loader = call["data_loader"]
        if call["poisson_sampling"]:  # make_private will replace the loader by a Poisson one with q = 1/len(loader)
            if reg.sampling is not Sampling.POISSON:
                raise LastIterateConfigurationError(
                    f"sampling was declared {reg.sampling.value!r} but "
                    "make_private_with_epsilon(poisson_sampling=True) replaces the data loader by a Poisson one. "
                    "Pass poisson_sampling=False with "
                    f"{_FIXES[reg.sampling]}, or register with sampling='poisson'."
                )
            n = len(loader.dataset)
            if n != reg.dataset_size:
                raise LastIterateConfigurationError(
                    f"dataset_size must equal len(data_loader.dataset) = {n}. Found {reg.dataset_size} registered."
                )
            facts = LoaderFacts(Sampling.POISSON, n, len(loader), None, 1.0 / len(loader), False, "Poisson (planned)")
        else:
            facts = check_data_loader(loader, reg.sampling, reg.dataset_size)
        _check_sgd(call["optimizer"], reg)
        clip = call["max_grad_norm"]
        if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not (0 < clip < math.inf):
            raise LastIterateConfigurationError(f"max_grad_norm must be a single finite number > 0. Found {clip!r}.")
        sample_rate = facts.opacus_sample_rate
        # make_private: expected_batch_size = int(n * sample_rate) in total over the workers
        normaliser = float(int(reg.dataset_size * sample_rate)) if call["loss_reduction"] == "mean" else 1.0
        b = _core_batch(reg, facts, 1)
        observed = _Observed(
            noise_multiplier=1.0,
            clip_norm=float(clip),
            loss_reduction=call["loss_reduction"],
            normaliser=normaliser,
            accumulated_iterations=1,
            sampling=facts.sampling.value,
            loader_batches=facts.num_batches,
            loader_batch_size=facts.batch_size,
            sample_rate=sample_rate,
            batch_size=b,
            learning_rate=reg.learning_rate * b / normaliser,
        )
        return observed, int(call["epochs"]) * facts.num_batches

    def training_config(self) -> TrainingConfig | None:
        """The core's description of the steps taken so far (None before the first step)."""
        if not self.history:
            return None
        noise = self._history_noise()
        if self._observed is not None:
            return self._config(self._observed, noise, self.steps)
        observed, planned = self._predicted()  # Opacus' calibration sets history without running the optimizer
        if not math.isclose(self.history[0][1], observed.sample_rate, rel_tol=1e-12):
            raise LastIterateConfigurationError(
                f"sample_rate must be 1/len(data_loader) = {observed.sample_rate:g}. Found {self.history[0][1]:g}."
            )
        # Opacus computes steps = int(epochs / sample_rate), which can round down by one
        return self._config(observed, noise, max(self.steps, planned))

    def epsilon_result(self, delta: float, bound: str | None = None) -> EpsilonResult | None:
        """The labelled result (bound, winner, relation, order, what it protects); None before any step."""
        delta = validate_delta(delta)
        config = self.training_config()
        if config is None:
            return None
        return self._compute(config, delta, bound)

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """Epsilon of the final model at ``delta`` (0 before the first step: the model
        is then independent of the data). Extra arguments (Opacus passes its
        calibration kwargs) are ignored."""
        result = self.epsilon_result(delta)
        return 0.0 if result is None else float(result.epsilon)

    def get_privacy_spent(self, *, delta: float) -> tuple[float, float]:
        """(epsilon, optimal order), like Opacus' RDPAccountant."""
        result = self.epsilon_result(delta)
        return (0.0, 0.0) if result is None else (float(result.epsilon), float(result.order))

    def report(self, delta: float, *, show: bool = False) -> Report:
        """Every bound side by side for the steps so far, with its relation, whether it
        applies (and why not), its epsilon, and the threat model. ``show`` prints it."""
        delta = validate_delta(delta)
        reg = self._registration
        config = self.training_config()
        if config is None:
            raise LastIterateConfigurationError("report needs at least one optimizer step. Found 0 steps.")
        rows = []
        for bid, spec in registry.BOUNDS.items():
            check = registry.applicability(spec, config, reg.assumptions)
            relation = spec.relation_for(config.sampling)
            eps = order = None
            if check.applies:
                result = self._compute(config, delta, bid)
                eps, order = result.epsilon, result.order
            rows.append(
                ReportRow(
                    bound=bid,
                    relation=None if relation is None else relation.value,
                    applies=check.applies,
                    epsilon=eps,
                    order=order,
                    protects="every iterate" if not spec.last_iterate else "the final model only",
                    reasons=check.reasons,
                    reference=spec.reference,
                )
            )
        try:
            best = self._compute(config, delta, registry.BEST)
            rows.append(
                ReportRow(
                    registry.BEST,
                    config.relation.value,
                    True,
                    best.epsilon,
                    best.order,
                    best.protects,
                    (f"via {best.winner}",),
                    "BOUNDS.md section 5",
                )
            )
        except ValueError as exc:
            rows.append(ReportRow(registry.BEST, config.relation.value, False, None, None, "-", (str(exc),), ""))
        out = Report(reg.name, delta, config.steps, config.sampling.value, config.relation.value, tuple(rows))
        if show:
            print(out)
        return out

    # -- checkpoints
    def state_dict(self, destination: Any = None) -> Any:
        destination = super().state_dict(destination if destination is not None else OrderedDict())
        destination["lastiter"] = {
            "format": 2,
            "registration": self._registration.to_dict(),
            "observed": None if self._observed is None else self._observed.to_dict(),
        }
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        reg = self._registration
        if not state_dict or "lastiter" not in state_dict:
            raise LastIterateConfigurationError(
                f"state_dict must come from a last-iterate accountant (key 'lastiter'). Found keys "
                f"{sorted(state_dict or {})}."
            )
        if state_dict.get("mechanism") != reg.name:
            raise LastIterateConfigurationError(
                f"state_dict of {state_dict.get('mechanism')!r} cannot be loaded into accountant {reg.name!r}."
            )
        extra = state_dict["lastiter"]
        if extra.get("registration") != reg.to_dict():
            raise LastIterateConfigurationError(
                f"the checkpoint was accounted under a different configuration of {reg.name!r}: "
                f"{extra.get('registration')} vs now {reg.to_dict()}. Register the same configuration to resume."
            )
        history = []
        for entry in state_dict.get("history", []):
            z, q, steps = entry
            history.append((float(z), float(q), int(steps)))
        observed = None if extra.get("observed") is None else _Observed.from_dict(extra["observed"])
        if observed is not None and history and self._binding is not None:
            self._check_permutation(observed.permutation_digest, self._binding.facts.permutation_digest)
        super().load_state_dict({"history": history, "mechanism": state_dict["mechanism"]})
        self._observed = observed
        self._resumed = bool(history)
        self._steady = None
