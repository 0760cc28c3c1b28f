"""The Opacus accountant: a ledger of the steps its run accounted (Opacus' ``history``), the departures they
showed and the last step's record; the number is the core's for the pipeline that ran (``host.account``)."""

from __future__ import annotations

import math
from collections import OrderedDict
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from opacus.accountants import IAccountant

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.opacus import _calibration as calibration
from lastiter_plugins.adapters.opacus import _checkpoint as checkpoint
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus import _make_private as binding
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError as _Error
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._glm import GlmRoute
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts, check_data_loader
from lastiter_plugins.adapters.opacus._record import Observed, StepRecord, pipeline
from lastiter_plugins.adapters.opacus._report import Report, build_report
from lastiter_plugins.adapters.opacus._run import Run
from lastiter_plugins.adapters.opacus._start import Start


class LastIterateAccountant(IAccountant):
    """Opacus accountant computing the epsilon of the run that happened with ``lastiter_plugins``.

    Do not instantiate this base class: ``register`` creates a configured subclass per name. ``history``
    keeps Opacus' format ``[(noise_multiplier, sample_rate, num_steps)]`` so that Opacus' calibration
    (``make_private_with_epsilon``) can drive it. A fact that breaks a row's precondition removes that row
    (``departures``); a fact that breaks every row, or the bound named, voids the accountant.
    """

    _registration: Registration | None = None

    def __init__(self) -> None:
        declared = type(self)._registration
        if declared is None:
            raise TypeError(
                "use lastiter_plugins.adapters.opacus.register(name, ...), then PrivacyEngine(accountant=name) "
                "(Opacus 1.6) or attach(PrivacyEngine(), name)"
            )
        super().__init__()
        self.history: list[tuple[float, float, int]] = []
        self.observed: Observed | None = None  # the run's mechanism (its first step's, or the checkpoint's)
        self.record: StepRecord | None = None  # the last step's
        self.departures: list[host.Departure] = []
        self.resumed = False  # loaded from a checkpoint, no step since
        self.start = Start()  # the model the run starts from: fresh, or trained by an earlier accountant
        self.run: Run | None = None
        self.void: str | None = None
        #: after load_state_dict: the digest of the model the checkpoint was saved with (checked at the next step)
        self.resume_digest: str | None = None
        self._glm = GlmRoute(declared) if declared.glm is not None else None  # model="glm": derives the loss
        self._saved_record: dict | None = None  # after load_state_dict: the checkpoint's index record

    # -- IAccountant
    @classmethod
    def mechanism(cls) -> str:
        name = cls._registration.name if cls._registration is not None else "lastiter"
        internals.refuse_host_calibration(name)  # Opacus 1.5's make_private_with_epsilon cannot create it
        return name

    @property
    def registration(self) -> Registration:
        """The registered configuration; on the GLM route, with the constants derived from the model."""
        if self._glm is not None:
            return self._glm.registration
        declared = type(self)._registration
        assert declared is not None  # __init__ refused the unregistered base class
        return declared

    @property
    def derivation(self) -> Any:
        """model="glm": the certificate and the facts it was derived from (None before it was derived)."""
        return None if self._glm is None else self._glm.derivation

    def __len__(self) -> int:
        return len(self.history)

    @property
    def steps(self) -> int:
        """Optimizer steps accounted for so far."""
        return checkpoint.steps_in(self.history)

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        z, q = float(noise_multiplier), float(sample_rate)
        if self.history and self.history[-1][:2] == (z, q):
            self.history[-1] = (z, q, self.history[-1][2] + 1)
        else:
            self.history.append((z, q, 1))

    def bind_data_loader(
        self, data_loader: Any, module: torch.nn.Module | None = None, loss: Any = None
    ) -> LoaderFacts:
        """Declare the data loader the training loop iterates (the one returned by ``make_private``) and the
        module the loop calls. Needed only when the optimizer hook was not created by Opacus'
        ``PrivacyEngine.make_private`` (which the accountant reads itself). Before any step, it also clears a
        refusal (the loop must then start a fresh pass). ``loss`` (``model="glm"`` only): the loss module the
        loop computes the loss with (``make_private`` reads it from its ``criterion`` argument)."""
        if loss is not None and self._glm is None:
            raise _Error("loss is for accountants registered with model='glm'. Found a loss module without it.")
        if module is not None and not isinstance(module, torch.nn.Module):
            raise _Error(f"module must be a torch.nn.Module. Found {type(module).__name__}.")
        facts = check_data_loader(data_loader, self.registration.sampling, self.registration.dataset_size)
        self._bind(facts, data_loader, module)
        if self._glm is not None:
            self._glm.bind(facts, module, loss)
        return facts

    def _bind(self, facts: LoaderFacts, loader: Any, module: Any, optim: Any = None, plan: Any = None) -> None:
        if self.resumed and self.observed is not None:
            checkpoint.check_permutation(self.registration, self.observed, facts)
        self.start.bind(self, module)
        derivation = self.run.derivation if self.run is not None and self.steps else None
        if self.run is not None:
            self.run.remove()
        self.run = Run(self, type(self)._registration or self.registration, self._glm, facts, loader,
                       module, optim, plan, derivation)  # fmt: skip
        if self._saved_record is not None and not derivation:
            self.run.derivation.restore(self._saved_record)
        if self.steps == 0:
            self.void = None

    def get_optimizer_hook_fn(self, sample_rate: float) -> Any:
        internals.require_tested_opacus()
        caller = internals.engine_locals("make_private")
        if caller is not None:  # validate at make_private time
            binding.refuse_second_model(self, caller.get("module"))
            if self._glm is not None:  # first derive the constants from the model
                self._glm.at_make_private(caller)
            reg, optim = self.registration, caller["optimizer"]
            facts = check_data_loader(caller["data_loader"], reg.sampling, reg.dataset_size)
            if not math.isclose(facts.opacus_sample_rate, sample_rate, rel_tol=1e-9):
                raise _Error(
                    f"sample_rate must be {facts.opacus_sample_rate:g} for this data loader. Found {sample_rate:g}."
                )
            binding.refuse_broken_declaration(reg, optim, facts)  # the bound named: refused here already
            outer = internals.engine_locals("make_private_with_epsilon")
            plan = (
                None
                if outer is None
                else (float(outer["target_epsilon"]), float(outer["target_delta"]), int(outer["epochs"]))
            )
            module = caller.get("module")
            self._bind(facts, caller["data_loader"], internals.unwrap(module) if not isinstance(module, torch.nn.Module)
                       else module, optim, plan)  # fmt: skip
        return self._account_step  # called by the DP optimizer at every step, after Opacus clipped and noised

    # -- one step
    def _account_step(self, optim: Any) -> None:
        """Check the step about to be taken (before the parameters change), then record it. A refusal voids the
        accountant."""
        if self.void is not None:
            raise _Changed(self.void_message())
        if self.run is None:
            raise _Error(
                f"accountant {self.registration.name!r} has not seen the data loader, so the declared sampling="
                f"{self.registration.sampling.value} cannot be verified. Create the optimizer with Opacus' "
                "PrivacyEngine.make_private, or call engine.accountant.bind_data_loader(data_loader, module=model)."
            )
        try:
            record, departures = self.run.step(optim, self.steps + 1)
            for departure in departures:
                self._depart(departure, record.observed, record.step)
            if self.observed is None and self.run.plan is not None:
                calibration.check_plan(self, record.observed, self.run.plan)
        except _Error as exc:
            self.void = str(exc)
            if isinstance(exc, _Changed):
                raise
            raise _Changed(str(exc)) from None
        self.observed, self.record, self.resumed = record.observed, record, False
        self.step(noise_multiplier=record.observed.noise_multiplier, sample_rate=record.observed.sample_rate)

    def _depart(self, departure: host.Departure, observed: Observed, steps: int) -> None:
        """Record a departure; refuse when the bound named (or require) no longer holds."""
        reg = self.registration
        config = pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, max(steps, 1))
        why = host.refusal(reg.declaration(), config, reg.assumptions, [*self.departures, departure])
        if why is not None:
            raise _Changed(f"{why} Register bound='best' (without require) to keep the rows that still apply.")
        self.departures.append(departure)

    def void_message(self) -> str:
        return (
            f"accountant {self.registration.name!r} refused a step of this run: {self.void} The run's epsilon "
            "is void (the run is no longer the one the accountant verified). Fix the cause, then start again "
            "with a new PrivacyEngine and model (or, before any step was accounted, call bind_data_loader "
            "and begin a fresh pass over the loader)."
        )

    # -- epsilon
    def _declared_config(self) -> lp.TrainingConfig | None:
        """The declared pipeline of the steps so far (before the departures), None before the first step."""
        if self._glm is not None:
            self._glm.before_epsilon(len(self.history))
        if self.void is not None:
            raise _Changed(self.void_message())
        if not self.history:
            return None
        reg = self.registration
        noise = calibration.history_noise(self.history)
        if self.observed is None:  # Opacus' calibration: a history, no optimizer step
            observed, steps = calibration.planned_run(self)
            return pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, steps).replace(
                noise_multiplier=noise
            )
        if self.run is not None:
            try:
                released = self.run.at_release(self.steps) if self.resume_digest is None else None
            except _Changed as exc:
                self.void = str(exc)
                raise _Changed(self.void_message()) from None
            if released is not None:
                self._depart(released, self.observed, self.steps)
            checkpoint.check_loaded_model(self)
        config = pipeline(reg.dataset_size, reg.sampling, reg.relation, self.observed, self.steps)
        return config.replace(noise_multiplier=noise)

    def training_config(self) -> lp.TrainingConfig | None:
        """The core's description of the pipeline that ran so far (the departures applied; None before the
        first step)."""
        config = self._declared_config()
        return (
            None if config is None else host.apply_departures(config, self.registration.assumptions, self.departures)[0]
        )

    def account(self, delta: float, bound: str | None = None) -> host.Account | None:
        """The number for the pipeline that ran, with the rows that left (None before any step)."""
        delta = _delta(delta)
        config, reg = self._declared_config(), self.registration
        if config is None:
            return None
        declaration = (
            reg.declaration() if bound is None else host.Declaration(bound, reg.published_only, reg.require, reg.orders)
        )
        return host.account(declaration, config, reg.assumptions, delta, self.departures)

    def epsilon_result(self, delta: float, bound: str | None = None) -> lp.EpsilonResult | None:
        """The labelled result (bound, winner, relation, order, what it protects); None before any step."""
        account = self.account(delta, bound)
        return None if account is None else account.result

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """Epsilon at ``delta`` of the run that happened (0 before the first step: the model is then independent
        of the data): ``best`` over the rows whose preconditions held at every step, for the registered
        relation. What it protects (the final model only, or every iterate), the rows that left and why, and
        what Opacus' own default accountant (``prv``) would print for the run, marked NOT VALID where its
        Poisson assumption fails, are in ``report(delta)``. Extra arguments (Opacus' calibration) are ignored."""
        result = self.epsilon_result(delta)
        return 0.0 if result is None else float(result.epsilon)

    def get_privacy_spent(self, *, delta: float) -> tuple[float, float | None]:
        """(epsilon, optimal order), like Opacus' RDPAccountant; the order is None when the bound is a
        privacy profile converted exactly (no Renyi order: ``EpsilonResult.order``)."""
        result = self.epsilon_result(delta)
        if result is None:
            return (0.0, 0.0)
        return (float(result.epsilon), None if result.order is None else float(result.order))

    def report(self, delta: float, *, show: bool = False) -> Report:
        """Every bound side by side for the steps so far (applies or why not, epsilon, what it protects), the
        rows that left ``best`` and why, Opacus' own number beside ours, and the threat model. ``show`` prints."""
        account = self.account(delta)
        if account is None:
            raise _Error("report needs at least one optimizer step. Found 0 steps.")
        out = build_report(self.registration, account, _delta(delta), self.observed)
        if show:
            print(out)
        return out

    # -- checkpoints
    def state_dict(self, destination: Any = None) -> Any:
        """Opacus' ``history`` and ``mechanism``, and under ``lastiter``: the registered configuration, the
        observed mechanism, the departures, the SHA-256 digest of the model after the last step (checked at
        the first step after ``load_state_dict``) and a refusal, if any."""
        return checkpoint.save(self, destination if destination is not None else OrderedDict())

    def load_state_dict(self, state_dict: Any) -> None:
        """Resume from ``state_dict``. The model's parameters and buffers are checked against the
        state's digest at the next step (and when an epsilon is read before it)."""
        if self._glm is not None:
            self._glm.before_load()
        loaded = checkpoint.read(state_dict, self.registration)
        if loaded.observed is not None and loaded.history and self.run is not None:
            checkpoint.check_permutation(self.registration, loaded.observed, self.run.facts)
        self.history = deepcopy(loaded.history)  # what IAccountant.load_state_dict sets, after the checks above
        self.observed, self.departures, self.void = loaded.observed, list(loaded.departures), loaded.void
        self.resumed = bool(loaded.history)
        self._saved_record, self.resume_digest = loaded.record, loaded.model_digest
        if self.run is not None and self._saved_record is not None:
            self.run.derivation.restore(self._saved_record)


def _delta(delta: Any) -> float:
    """``delta`` as a float in (0, 1); a 0-dim tensor or array (``torch.tensor(1e-5)``) is its value."""
    from lastiter_plugins.validation import validate_delta

    if isinstance(delta, (torch.Tensor, np.ndarray)) and delta.ndim == 0:
        delta = delta.item()
    return validate_delta(delta)
