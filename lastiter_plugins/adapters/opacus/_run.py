"""One run of an accountant: from ``make_private`` (or ``bind_data_loader``) to the next binding.

The run holds the host patches (``_patches``: installed while a run is alive), the loader's facts, the
module the loop calls, and the run checks (``_checks``), in the order of docs/opacus.md, *Verified at
every step*. At every step it checks that the optimizer is the bound one, observes the mechanism
(``_record.observe``, validated), hands the step to every check (a check raises for a fact every row needs,
or returns a departure), and returns the step's immutable record; the ledger (the accountant) keeps the
history, the departures and the record.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _checks as checks
from lastiter_plugins.adapters.opacus._checkpoint import digest, model_differs, refuse_resumed_step
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._glm import GlmRoute
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts
from lastiter_plugins.adapters.opacus._patches import PATCHES
from lastiter_plugins.adapters.opacus._record import CLIPPING, Observed, StepRecord, observe, raw_facts
from lastiter_plugins.host import Departure

if TYPE_CHECKING:
    from lastiter_plugins.adapters._derivation import Derivation
    from lastiter_plugins.adapters.opacus._accountant import LastIterateAccountant


class Run:
    """One binding: the loader, the private module, the checks, and (once seen) the DP optimizer.

    Args:
      ledger: the accountant the steps are recorded in (held weakly).
      declared: the registration.
      glm: the linear route (``model="glm"``), or None.
      facts: the loader's facts, checked against the declaration.
      loader: the loader the loop iterates.
      module: the module the loop calls (the private module, or the model with ``wrap_model=False``), or None.
      optim: the DP optimizer, when known at binding (``make_private``), else seen at the first step.
      plan: ``make_private_with_epsilon``'s (target_epsilon, target_delta, epochs), or None.
      derivation: the index record to continue (a re-binding after steps), or None.
    """

    def __init__(
        self,
        ledger: LastIterateAccountant,
        declared: Registration,
        glm: GlmRoute | None,
        facts: LoaderFacts,
        loader: Any,
        module: torch.nn.Module | None,
        optim: Any = None,
        plan: tuple[float, float, int] | None = None,
        derivation: Derivation | None = None,
    ) -> None:
        PATCHES.hold(self)  # (before the loop's first batch: the batch queue records at the sampler)
        self._ledger = weakref.ref(ledger)
        self.declared, self.glm, self.facts, self.plan = declared, glm, facts, plan
        self.module = None if module is None else weakref.ref(module)
        self._raw: tuple | None = None
        self._observed: Observed | None = None
        ghost = checks.GhostBackward(optim) if optim is not None and _clipping(optim) == "ghost" else None
        self.ghost = ghost
        self.examples = checks.OneGradientPerExample(module, loader.batch_sampler, ghost)
        self.batches = checks.DrawnBatches(loader, facts, derivation)
        self.generators = checks.SamplingGenerator(loader, facts)  # (before the first pass starts)
        self.batches.queue.on_adopt.append(self.generators.adopted)
        self.loader = checks.BoundLoader(loader, facts)
        allocation = facts.sampling is lp.Sampling.RANDOM_ALLOCATION
        self.allocation = checks.DrawnAllocation(facts) if allocation else None
        self.buffers = checks.FrozenBuffers(module)  # the module's buffers at binding, with their values
        self.metric_rules = None if optim is None else checks.MetricRules(optim)
        self.optimizer: checks.BoundOptimizer | None = None
        self.writes: checks.AccountedWrites | None = None
        self.projection: checks.DeclaredProjection | None = None
        self.order: list[checks.Check] = []  # every check, in order (complete from the first step on)
        #: the order without the checks that read only the optimizer values ``raw_facts`` reads (the mechanism's
        #: constancy, the update): a step whose values equal the previous step's skips them
        self.varying: list[checks.Check] = []

    @property
    def ledger(self) -> LastIterateAccountant:
        ledger = self._ledger()
        assert ledger is not None  # the accountant holds its run
        return ledger

    @property
    def registration(self) -> Registration:
        """The declaration; on the GLM route, with the constants derived from the model."""
        return self.glm.registration if self.glm is not None else self.declared

    @property
    def derivation(self) -> Derivation:
        return self.batches.derivation

    def remove(self) -> None:
        for check in {id(c): c for c in [*self.order, self.examples]}.values():
            check.remove()
        if self.ghost is not None:
            self.ghost.remove()

    def _first_step(self, optim: Any) -> None:
        """The checks that need the optimizer, then the order of every check."""
        if _clipping(optim) == "ghost" and self.ghost is None:
            raise LastIterateConfigurationError(
                "ghost clipping (grad_sample_mode='ghost') must be bound by PrivacyEngine.make_private, which the "
                "accountant reads to watch the criterion it returns from the first backward on. Found a run bound "
                "by bind_data_loader. Call make_private."
            )
        checks.refuse_public_noise(optim)  # (bind_data_loader: the optimizer is seen here)
        module = self.module() if self.module is not None else None
        reg = self.registration
        self.optimizer = checks.BoundOptimizer(optim, module)
        self.writes = checks.AccountedWrites(optim, module)
        if self.metric_rules is None:
            self.metric_rules = checks.MetricRules(optim)
        if reg.assumptions.diameter is not None:
            self.projection = checks.DeclaredProjection(optim, reg.assumptions.diameter)
        within = (
            checks.DeclaredWithinClip(module if self.ghost is not None else None)
            if reg.assumptions.gradient_norms_within_clip and self.glm is None
            else None
        )
        route = None if self.glm is None else checks.LinearRoute(self.glm)
        constant, update = checks.ConstantMechanism(), checks.PlainSgd()
        order: list[Any] = [
            route,
            constant,
            update,
            checks.PerLayerClipping() if _clipping(optim) == "per_layer" else None,
            self.ghost,
            self.metric_rules,
            self.loader,
            self.examples,
            self.batches,
            self.allocation,
            self.generators,
            within,
        ]
        self.order = [c for c in order if c is not None]
        self.varying = [c for c in self.order if c is not constant and c is not update]

    def step(self, optim: Any, number: int) -> tuple[StepRecord, list[Departure]]:
        """Check step ``number``: its record and the departures it showed (raises for a fact every row needs)."""
        if self.optimizer is None:
            self._first_step(optim)
        assert self.optimizer is not None and self.writes is not None  # created by _first_step
        self.optimizer.verify(optim, number)
        raw = raw_facts(optim)
        unchanged = raw is not None and raw == self._raw
        if not unchanged or self._observed is None:  # validated in full when a value it reads changed
            reg = self.registration
            self._observed = observe(optim, reg.learning_rate, reg.dataset_size, self.facts)
            self._raw = raw
        observed = self._observed
        ledger = self._ledger()
        assert ledger is not None  # the accountant holds its run
        if ledger.start.prior is not None:  # the model was trained by an earlier engine: continue or refuse
            ledger.start.continue_prior(ledger, observed)
            number = ledger.steps + 1
        step = checks.Step(number, optim, self, observed, unchanged)
        departures = []
        for check in self.varying if unchanged and not ledger.resumed else self.order:
            departure = check.at_step(step)
            if departure is not None:
                departures.append(departure)
        if ledger.resume_digest is not None:  # the first step after load_state_dict: the checkpoint's model
            problem = model_differs(self.model_tensors(), ledger.resume_digest, number - 1)
            if problem is not None:
                raise refuse_resumed_step(problem, number - 1)
            ledger.resume_digest = None
            self.writes.rebase()
            self.buffers.rebase()
        self.writes.at_step(step)
        self.buffers.at_step(step)
        if self.projection is not None and (departure := self.projection.at_step(step)) is not None:
            departures.append(departure)
        if self.ghost is not None:
            self.ghost.reset()
        assert step.gradients is not None  # counted by the examples check
        base = optim.original_optimizer
        rates = tuple([float(g["lr"]) for g in base.param_groups])
        return StepRecord(number, observed, _name(type(base)), rates, step.gradients), departures

    def at_release(self, steps: int) -> Departure | None:
        """When an epsilon is read: nothing changed the model since the last step (refused), and the declared
        domain held after it (a departure)."""
        if self.writes is not None:
            self.writes.verify(steps)
        self.buffers.verify(steps, release=True)
        if self.projection is not None and not self.projection.left:
            why = self.projection.broken(steps)
            if why is not None:
                self.projection.left = True
                return Departure(max(steps, 1), why, {"diameter": None})
        return None

    def model_tensors(self) -> list[torch.Tensor] | None:
        """The module's parameters and tracked buffers (without a module: the trained parameters)."""
        module = self.module() if self.module is not None else None
        if module is not None:
            return [*module.parameters(), *(b for *_, b in checks.tracked_buffers(module))]
        return None if self.optimizer is None else list(self.optimizer.params)

    def model_digest(self) -> str | None:
        tensors = self.model_tensors()
        return None if tensors is None else digest(tensors)


_NAMES: dict[type, str] = {}


def _name(cls: type) -> str:
    """``module.qualname`` of a class (remembered: the record is made at every step)."""
    name = _NAMES.get(cls)
    if name is None:
        name = _NAMES[cls] = f"{cls.__module__}.{cls.__qualname__}"
    return name


def _clipping(optim: Any) -> str | None:
    return CLIPPING.get(type(optim))
