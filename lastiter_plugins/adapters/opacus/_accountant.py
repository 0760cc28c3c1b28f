"""The Opacus accountant: a ledger of the steps its run accounted (Opacus' ``history``), the departures they
showed and the last step's record; the number is the core's for the pipeline that ran (``host.account``)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from opacus.accountants import IAccountant

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.opacus import _binding as binding
from lastiter_plugins.adapters.opacus import _calibration as calibration
from lastiter_plugins.adapters.opacus import _checkpoint as checkpoint
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError as _Error
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._glm import GlmRoute
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts
from lastiter_plugins.adapters.opacus._record import Observed, StepRecord, core_assumptions, pipeline
from lastiter_plugins.adapters.opacus._report import Report, build_report
from lastiter_plugins.adapters.opacus._run import Run
from lastiter_plugins.adapters.opacus._start import Start
from lastiter_plugins.validation import validate_delta


class LastIterateAccountant(IAccountant):
    """Opacus accountant giving the run that happened the core's number (``register`` creates a configured
    subclass per name; this base class cannot be created). ``history`` keeps Opacus' format
    ``[(noise_multiplier, sample_rate, num_steps)]`` (``make_private_with_epsilon`` drives it). A fact that
    breaks a row's precondition removes that row (``departures``); one every row needs, or that breaks the
    bound named, voids the accountant: every later step and epsilon raises."""

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
        self.run: Run | None = None
        self.void: str | None = None  # why the run was refused
        self.start = Start()  # the model the run starts from: fresh, or trained by an earlier accountant
        self.glm = GlmRoute(declared) if declared.glm is not None else None  # model="glm": derives the loss
        self.resumed = False  # loaded from a checkpoint, no step since
        self.resume_digest: str | None = None  # the checkpoint's model, checked at the next step
        self.saved_record: dict | None = None  # the checkpoint's index record

    @classmethod
    def mechanism(cls) -> str:
        name = cls._registration.name if cls._registration is not None else "lastiter"
        internals.refuse_host_calibration(name)  # Opacus 1.5's make_private_with_epsilon cannot create it
        return name

    @property
    def registration(self) -> Registration:
        """The registered configuration; on the GLM route, with the constants derived from the model."""
        declared = type(self)._registration
        assert declared is not None  # __init__ refused the unregistered base class
        return self.glm.registration if self.glm is not None else declared

    @property
    def derivation(self) -> Any:
        """model="glm": the certificate and the facts it was derived from (None before it was derived)."""
        return None if self.glm is None else self.glm.derivation

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
        """Declare the loader the training loop iterates and the module it calls, when the optimizer hook was not
        created by Opacus' ``make_private`` (read by the accountant itself). Before any step it also clears a
        refusal (the loop must then start a fresh pass). ``loss`` (``model="glm"``): the loss module used."""
        return binding.bind_data_loader(self, data_loader, module, loss)

    def get_optimizer_hook_fn(self, sample_rate: float) -> Any:
        internals.require_tested_opacus()
        caller = internals.engine_locals("make_private")
        if caller is not None:  # checked at make_private
            binding.at_make_private(self, caller, sample_rate)
        return self._account_step  # called by the DP optimizer at every step, after Opacus clipped and noised

    def _account_step(self, optim: Any) -> None:
        """Check the step about to be taken (before the parameters change), then record it."""
        if self.void is not None:
            raise _Changed(self.void_message())
        if self.run is None:
            reg = self.registration
            raise _Error(
                f"accountant {reg.name!r} has not seen the data loader, so the declared sampling={reg.sampling.value} "
                "cannot be verified. Create the optimizer with Opacus' PrivacyEngine.make_private, or call "
                "engine.accountant.bind_data_loader(data_loader, module=model) before training."
            )
        try:
            record, departures = self.run.step(optim, self.steps + 1)
            for departure in departures:
                self.depart(departure, record.observed, record.step)
            if self.observed is None and self.run.plan is not None:
                calibration.check_plan(self, record.observed, self.run.plan)
        except _Error as exc:
            self.void = str(exc)
            raise exc if isinstance(exc, _Changed) else _Changed(str(exc)) from None
        self.observed, self.record, self.resumed = record.observed, record, False
        self.step(noise_multiplier=record.observed.noise_multiplier, sample_rate=record.observed.sample_rate)

    def depart(self, departure: host.Departure, observed: Observed, steps: int) -> None:
        """Record a departure; refuse when the bound named (or ``require``) no longer holds."""
        reg = self.registration
        config = pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, max(steps, 1))
        assumptions = core_assumptions(reg, observed)
        why = host.refusal(reg.declaration(), config, assumptions, [*self.departures, departure])
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

    def training_config(self) -> lp.TrainingConfig | None:
        """The core's description of the pipeline that ran so far, departures applied (None before a step)."""
        config = calibration.declared_config(self)
        assumptions = core_assumptions(self.registration, self.observed)
        return None if config is None else host.apply_departures(config, assumptions, self.departures)[0]

    def account(self, delta: float, bound: str | None = None) -> host.Account | None:
        """The number for the pipeline that ran, with the rows that left (None before any step)."""
        delta = _delta(delta)
        config, reg = calibration.declared_config(self), self.registration
        if config is None:
            return None
        declaration = (
            reg.declaration() if bound is None else host.Declaration(bound, reg.published_only, None, reg.orders)
        )
        assumptions = core_assumptions(reg, self.observed)
        return host.account(declaration, config, assumptions, delta, self.departures)

    def epsilon_result(self, delta: float, bound: str | None = None) -> lp.EpsilonResult | None:
        """The labelled result (bound, winner, relation, order, what it protects); None before any step."""
        account = self.account(delta, bound)
        return None if account is None else account.result

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """Epsilon at ``delta`` of the run that happened (0 before the first step): ``best`` over the rows whose
        preconditions held at every step, for the registered relation. ``report(delta)`` says what it protects
        (the final model only, or every iterate), which rows left and why, and what Opacus' own default
        accountant (``prv``) would print for the run, NOT VALID where its Poisson assumption fails.
        Extra arguments (Opacus' calibration) are ignored."""
        result = self.epsilon_result(delta)
        return 0.0 if result is None else float(result.epsilon)

    def get_privacy_spent(self, *, delta: float) -> tuple[float, float | None]:
        """(epsilon, optimal order), like Opacus' RDPAccountant; the order is None for a privacy profile."""
        result = self.epsilon_result(delta)
        if result is None:
            return (0.0, 0.0)
        return (float(result.epsilon), None if result.order is None else float(result.order))

    def report(self, delta: float, *, show: bool = False, explain: bool = False) -> Report:
        """The answer first (the number, what it protects, its relation, the winning row and its provenance,
        Opacus' own numbers NOT VALID where their assumption fails); then, in ``explain()`` (or ``str()`` with
        ``explain=True``), every bound side by side, the rows that left ``best`` and why, the advice and the
        threat model. ``show`` prints it."""
        account = self.account(delta)
        if account is None:
            raise _Error("report needs at least one optimizer step. Found 0 steps.")
        seeds = () if self.run is None else self.run.generators.notes()
        out = build_report(
            self.registration, account, _delta(delta), self.observed, tuple(self.departures), seeds, explain=explain
        )
        if show:
            print(out)
        return out

    def state_dict(self, destination: Any = None) -> Any:
        """Opacus' ``history`` and ``mechanism``; under ``lastiter`` the registration, the mechanism observed,
        the departures, the model's SHA-256 digest after the last step and a refusal, if any."""
        return checkpoint.save(self, destination if destination is not None else OrderedDict())

    def load_state_dict(self, state_dict: Any) -> None:
        """Resume from ``state_dict`` (the model is checked against its digest at the next step, or an epsilon)."""
        checkpoint.load(self, state_dict)


def _delta(delta: Any) -> float:
    """``delta`` as a float in (0, 1); a 0-dim tensor or array (``torch.tensor(1e-5)``) is its value."""
    if isinstance(delta, (torch.Tensor, np.ndarray)) and delta.ndim == 0:
        delta = delta.item()
    return validate_delta(delta)
