"""The Opacus accountant: verifies every optimizer step against its configuration, then
computes the last-iterate epsilon of the run that actually happened with the core."""

from __future__ import annotations

import math
from collections import OrderedDict
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from opacus.accountants import IAccountant

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _checkpoint as checkpoint
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._calibration import planned_run
from lastiter_plugins.adapters.opacus._glm import GlmRoute
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts, check_data_loader
from lastiter_plugins.adapters.opacus._monitor import RunMonitor
from lastiter_plugins.adapters.opacus._observe import (
    ExampleCounter,
    Observed,
    check_dp_optimizer,
    unwrap,
)
from lastiter_plugins.adapters.opacus._registration import (
    LastIterateConfigurationError,
    LastIteratePipelineChangedError,
    Registration,
)
from lastiter_plugins.adapters.opacus._report import Report, build_report
from lastiter_plugins.adapters.opacus._start import Start
from lastiter_plugins.adapters.opacus._steps import StepChecks, digest, tracked_buffers

Sampling = lp.Sampling
_EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
_Error = LastIterateConfigurationError


def _merge_step(history: list, noise_multiplier: float, sample_rate: float) -> None:
    """Append one step to an Opacus-format history [(noise_multiplier, sample_rate, steps)]."""
    if history and history[-1][0] == noise_multiplier and history[-1][1] == sample_rate:
        z, q, steps = history[-1]
        history[-1] = (z, q, steps + 1)
    else:
        history.append((noise_multiplier, sample_rate, 1))


class LastIterateAccountant(IAccountant):
    """Opacus accountant computing a last-iterate epsilon with ``lastiter_plugins``.

    Do not instantiate this base class: ``register`` creates a configured subclass
    per name. ``history`` keeps Opacus' format ``[(noise_multiplier, sample_rate,
    num_steps)]`` so that Opacus' calibration (``make_private_with_epsilon``) can drive it.
    A refused step voids the accountant: every later step and epsilon raises.
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
        #: model="glm": the route that derives the loss assumptions and watches loss and model (one more check)
        self._glm = GlmRoute(declared) if declared.glm is not None else None
        self.history: list[tuple[float, float, int]] = []
        self._observed: Observed | None = None
        self._resumed = False
        #: after load_state_dict: the digest of the model the checkpoint's state was saved with,
        #: checked at the next step (or None: nothing to check)
        self._resume_digest: str | None = None
        self._counter: ExampleCounter | None = None
        self._monitor: RunMonitor | None = None
        #: after load_state_dict: the checkpoint's index record (the passes the resumed ones are compared with)
        self._saved_record: dict | None = None
        #: an accountant of this library that accounted earlier steps of the model bound now (continued
        #: at the first step when its configuration is this one's)
        self._start = Start()  # the model the run starts from: fresh, or trained by an earlier accountant
        self._void: str | None = None

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
        _merge_step(self.history, float(noise_multiplier), float(sample_rate))

    def bind_data_loader(
        self, data_loader: Any, module: torch.nn.Module | None = None, loss: torch.nn.Module | None = None
    ) -> LoaderFacts:
        """Declare the data loader the training loop iterates (the one returned by
        ``make_private``) and the private module (``GradSampleModule``) the loop calls.
        Needed only when the optimizer hook was not created by Opacus'
        ``PrivacyEngine.make_private`` (which the accountant reads itself). Before any
        step, it also clears a refusal (the loop must then start a fresh pass). ``loss``
        (``model="glm"`` only): the loss module the loop computes the loss with
        (``make_private`` reads it from its ``criterion`` argument)."""
        if loss is not None and self._glm is None:
            raise _Error("loss is for accountants registered with model='glm'. Found a loss module without it.")
        reg = self.registration
        facts = check_data_loader(data_loader, reg.sampling, reg.dataset_size)
        self._bind(facts, None, data_loader, module)
        if self._glm is not None:
            self._glm.bind(facts, module, loss)
        return facts

    def _bind(self, facts: LoaderFacts, plan: Any, data_loader: Any, module: Any) -> None:
        if module is not None and not isinstance(module, torch.nn.Module):
            raise _Error(f"module must be a torch.nn.Module. Found {type(module).__name__}.")
        if self._resumed and self._observed is not None:
            checkpoint.check_permutation(self.registration, self._observed.permutation_digest, facts.permutation_digest)
        self._start.bind(self, module)
        derivation = self._monitor.derivation if self._monitor is not None and self.steps else None
        if self._monitor is not None:
            self._monitor.remove()
        # (before the loop's first batch: it records at the sampler)
        self._monitor = RunMonitor(data_loader, facts, derivation, module, plan)
        if self._saved_record is not None and not derivation:
            self._monitor.derivation.restore(self._saved_record)
        if self._counter is not None and not self._counter.watches(module):
            self._counter.remove()
            self._counter = None
        if module is not None and self._counter is None:
            self._counter = ExampleCounter(module)
        if self._counter is not None:
            self._counter.reset()
        if self.steps == 0:
            self._void = None

    def get_optimizer_hook_fn(self, sample_rate: float):
        internals.require_tested_opacus()
        caller = internals.engine_locals("make_private")
        if caller is not None:
            self._refuse_second_model(caller.get("module"))
        if caller is not None and self._glm is not None:  # first derive the constants from the model
            self._glm.at_make_private(caller)
        reg = self.registration  # (on the GLM route: with the derived constants and weight decay)
        if caller is not None:  # validate at make_private time
            facts = check_data_loader(caller["data_loader"], reg.sampling, reg.dataset_size)
            if not math.isclose(facts.opacus_sample_rate, sample_rate, rel_tol=1e-9):
                raise _Error(
                    f"sample_rate must be {facts.opacus_sample_rate:g} for this data loader. Found {sample_rate:g}."
                )
            check_dp_optimizer(caller["optimizer"], reg)
            plan = None
            outer = internals.engine_locals("make_private_with_epsilon")
            if outer is not None:
                plan = (float(outer["target_epsilon"]), float(outer["target_delta"]), int(outer["epochs"]))
            module = caller.get("module")
            self._bind(facts, plan, caller["data_loader"], module if isinstance(module, torch.nn.Module) else None)

        return self._account_step  # called by the DP optimizer at every step

    def _refuse_second_model(self, module: Any) -> None:
        """``make_private`` again on this accountant's engine, for another model while the first is alive: both
        optimizers would report their steps to this one accountant (one run each is what it counts)."""
        monitor = self._monitor
        bound = monitor.module() if monitor is not None and monitor.module is not None else None
        if bound is None or module is None or unwrap(bound) is unwrap(module):
            return
        raise _Error(
            f"make_private must be called once per PrivacyEngine: its accountant ({self.registration.name!r}) "
            "accounts the run of one model. Found a second make_private on the same engine for another model "
            f"({type(unwrap(module)).__name__}) while the first ({type(unwrap(bound)).__name__}) is still in use: "
            "both optimizers would report their steps to this accountant. Use one PrivacyEngine per model (and "
            "account for releasing both models together by composition)."
        )

    # -- one step
    def _account_step(self, optim: Any) -> None:
        """Verify the step about to be taken (the hook runs after Opacus clipped and noised it,
        before the parameters change), then record it. A refusal voids the accountant."""
        if self._void is not None:
            raise LastIteratePipelineChangedError(self._void_message())
        try:
            self._verify(optim)
        except LastIterateConfigurationError as exc:
            self._void = str(exc)
            if isinstance(exc, LastIteratePipelineChangedError):
                raise
            raise LastIteratePipelineChangedError(str(exc)) from None
        finally:
            if self._counter is not None:
                self._counter.reset()

    def _void_message(self) -> str:
        return (
            f"accountant {self.registration.name!r} refused a step of this run: {self._void} The run's epsilon "
            "is void (the run is no longer the one the accountant verified). Fix the cause, then start again "
            "with a new PrivacyEngine and model (or, before any step was accounted, call bind_data_loader "
            "and begin a fresh pass over the loader)."
        )

    def _verify(self, optim: Any) -> None:
        """The facts of docs/opacus.md, *Verified at every step*, in its order; then the step is recorded."""
        monitor, steps, glm = self._monitor, self.steps, self._glm
        if monitor is None:
            reg = self.registration
            raise _Error(
                f"accountant {reg.name!r} has not seen the data loader, so the declared sampling={reg.sampling.value} "
                "cannot be verified. Create the optimizer with Opacus' PrivacyEngine.make_private, or call "
                "engine.accountant.bind_data_loader(data_loader, module=model) before training."
            )
        watch = None
        if glm is not None:
            glm.derive_at_step(optim)  # (bound by bind_data_loader: the constants are derived at the first step)
            watch = glm.watch
            assert watch is not None  # hooked where the constants were derived (make_private, or derive_at_step)
        observed = monitor.observe_optimizer(optim, self.registration, steps + 1)  # the optimizer, in core terms
        if watch is not None:  # what the GLM constants were derived for: clip norm, feature clip, loss module
            watch.check_configuration(optim)
        if self._start.prior is not None:  # the model was trained by an earlier engine: continue or refuse
            self._start.continue_prior(self, observed)
            steps = self.steps
        self._verify_constant(observed, steps, monitor.plan)  # ... the same as at the first step
        problem = monitor.observe_examples(optim, self._counter)  # the loader, the examples, the batch drawn
        if problem is not None:
            raise LastIteratePipelineChangedError(f"{problem} (step {steps + 1}).")
        checks = monitor.checks
        assert checks is not None  # created by observe_optimizer above
        if watch is not None:  # the per-example gradients are the declared GLM's, the feature norms <= A
            watch.check_examples(optim)
        elif self.registration.assumptions.gradient_norms_within_clip:  # declared by hand: clipping was inactive
            checks.verify_within_clip(optim, steps + 1)
        if self._resume_digest is not None:  # the first step after load_state_dict: the checkpoint's model
            self._verify_resumed_model(steps, self._resume_digest)
            checks.rebase()
        checks.verify_model(steps)  # parameters and buffers changed only by the accounted steps
        self._observed = observed
        self._resumed = False
        checks.mark_pending()
        self.step(noise_multiplier=observed.noise_multiplier, sample_rate=observed.sample_rate)

    def _checks(self) -> StepChecks | None:
        """The step checks of the current binding (None before its first step)."""
        return None if self._monitor is None else self._monitor.checks

    def _model_tensors(self) -> list[torch.Tensor] | None:
        """The private module's parameters and tracked buffers (without a module: the trained parameters)."""
        monitor = self._monitor
        module = monitor.module() if monitor is not None and monitor.module is not None else None
        if module is not None:
            return [*module.parameters(), *(b for *_, b in tracked_buffers(module))]
        return None if monitor is None or monitor.checks is None else list(monitor.checks.params)

    def _verify_resumed_model(self, steps: int, expected: str) -> None:
        problem = checkpoint.model_differs(self._model_tensors(), expected, self.steps)
        if problem is not None:
            raise checkpoint.refuse_resumed_step(problem, steps)
        self._resume_digest = None

    def _check_loaded_model(self, expected: str) -> None:
        """Before the first step after load_state_dict, an epsilon is about the checkpoint's model only."""
        problem = checkpoint.model_differs(self._model_tensors(), expected, self.steps)
        if problem is not None:
            raise checkpoint.refuse_loaded_epsilon(problem)

    def _verify_constant(self, observed: Observed, steps: int, plan: tuple[float, float, int] | None) -> None:
        if self._resumed and self._observed is not None:
            checkpoint.check_permutation(
                self.registration, self._observed.permutation_digest, observed.permutation_digest
            )
        if self._observed is not None and observed is not self._observed and observed != self._observed:
            changed = [
                f"{k}: {getattr(self._observed, k)!r} -> {getattr(observed, k)!r}"
                for k in observed.to_dict()
                if getattr(observed, k) != getattr(self._observed, k)
            ]
            raise LastIteratePipelineChangedError(
                f"the training configuration must stay constant for a last-iterate bound (step {steps + 1}). "
                f"Found a change in {'; '.join(changed)}. Noise, clipping, batch and step-size schedules are not "
                "covered; start a new accountant for a new configuration."
            )
        if self._resumed and Sampling(observed.sampling) in _EPOCH_SCHEMES and steps % observed.loader_batches:
            raise _Error(
                f"a run with sampling={observed.sampling} must resume at an epoch boundary (a restarted data "
                f"loader would reuse the examples of the interrupted epoch). Found {steps} steps, "
                f"{observed.loader_batches} per epoch. Save checkpoints at the end of epochs."
            )
        if self._observed is None and plan is not None:
            self._check_plan(observed, plan)

    def _check_plan(self, observed: Observed, plan: tuple[float, float, int]) -> None:
        """The run make_private_with_epsilon calibrated for must still reach its target."""
        target_epsilon, target_delta, epochs = plan
        steps = epochs * observed.loader_batches
        eps = self._compute(self._config(observed, observed.noise_multiplier, steps), target_delta).epsilon
        if eps > target_epsilon:
            raise _Error(
                f"epsilon after the planned {epochs} epochs must be <= target_epsilon = {target_epsilon:g} as "
                f"make_private_with_epsilon calibrated, but the run observed at the first step (batch_size="
                f"{observed.batch_size}, learning_rate={observed.learning_rate:g}, {steps} steps) would give "
                f"epsilon = {eps:.6g}. Calibrate with lastiter_plugins.calibrate_noise and call make_private instead."
            )

    # -- epsilon
    def _config(self, observed: Observed, noise_multiplier: float, steps: int) -> lp.TrainingConfig:
        reg = self.registration
        return lp.TrainingConfig(
            dataset_size=reg.dataset_size,
            batch_size=observed.batch_size,
            noise_multiplier=noise_multiplier,
            steps=steps,
            sampling=reg.sampling,
            learning_rate=observed.learning_rate,
            clip_norm=observed.clip_norm,
            relation=reg.relation,
        )

    def _compute(self, config: lp.TrainingConfig, delta: float, bound: str | None = None) -> lp.EpsilonResult:
        reg = self.registration
        orders = None if reg.orders is None else np.array(reg.orders)
        return lp.epsilon(
            bound or reg.bound,
            delta,
            orders,
            published_only=reg.published_only,
            config=config,
            assumptions=reg.assumptions,
        )

    def _history_noise(self) -> float:
        noises = {entry[0] for entry in self.history}
        rates = {entry[1] for entry in self.history}
        if len(noises) > 1 or len(rates) > 1:
            raise _Error(
                "noise_multiplier and sample_rate must be constant over the run for a last-iterate bound. "
                f"Found noise multipliers {sorted(noises)} and sample rates {sorted(rates)} in the history."
            )
        return float(next(iter(noises)))

    def training_config(self) -> lp.TrainingConfig | None:
        """The core's description of the steps taken so far (None before the first step)."""
        if self._glm is not None:
            self._glm.before_epsilon(self.registration.name, len(self.history))
        if self._void is not None:
            raise LastIteratePipelineChangedError(self._void_message())
        if not self.history:
            return None
        noise = self._history_noise()
        if self._observed is not None:
            if self._resume_digest is not None:
                self._check_loaded_model(self._resume_digest)
            elif (checks := self._checks()) is not None:  # nothing may have changed the model since the last step
                try:
                    checks.verify_model(self.steps, release=True)
                except LastIteratePipelineChangedError as exc:
                    self._void = str(exc)
                    raise LastIteratePipelineChangedError(self._void_message()) from None
            return self._config(self._observed, noise, self.steps)
        observed, planned = planned_run(self.registration)  # Opacus' calibration: a history, no optimizer step
        if not math.isclose(self.history[0][1], observed.sample_rate, rel_tol=1e-12):
            raise _Error(
                f"sample_rate must be 1/len(data_loader) = {observed.sample_rate:g}. Found {self.history[0][1]:g}."
            )
        # Opacus computes steps = int(epochs / sample_rate), which can round down by one
        return self._config(observed, noise, max(self.steps, planned))

    def epsilon_result(self, delta: float, bound: str | None = None) -> lp.EpsilonResult | None:
        """The labelled result (bound, winner, relation, order, what it protects); None before any step."""
        delta = _delta(delta)
        config = self.training_config()
        return None if config is None else self._compute(config, delta, bound)

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """Epsilon of the final model at ``delta`` (0 before the first step: the model is then
        independent of the data). Extra arguments (Opacus' calibration kwargs) are ignored."""
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
        """Every bound side by side for the steps so far (relation, applies or why not, epsilon,
        what it protects) and the threat model. ``show`` prints it."""
        delta = _delta(delta)
        config = self.training_config()
        if config is None:
            raise _Error("report needs at least one optimizer step. Found 0 steps.")
        reg = self.registration
        out = build_report(reg.name, config, reg.assumptions, delta, reg.orders, published_only=reg.published_only)
        if show:
            print(out)
        return out

    # -- checkpoints
    def state_dict(self, destination: Any = None) -> Any:
        """Opacus' ``history`` and ``mechanism``, and under ``lastiter``: the registered configuration,
        the observed optimizer facts, the SHA-256 digest of the model's parameters and buffers after
        the last step (checked at the first step after ``load_state_dict``) and a refusal, if any."""
        checks = self._checks()
        if self._void is None and checks is not None and self.history and self._resume_digest is None:
            try:  # a model written since the last step is not the accounted run's: the state says so
                checks.verify_model(self.steps, release=True)
            except LastIteratePipelineChangedError as exc:
                self._void = str(exc)
        tensors = self._model_tensors()
        model_digest = self._resume_digest if self._resume_digest is not None or tensors is None else digest(tensors)
        # Opacus' two keys, written here (as Opacus 1.6 does; 1.5's IAccountant stores the mechanism method)
        destination = destination if destination is not None else OrderedDict()
        destination["history"] = deepcopy(self.history)
        destination["mechanism"] = self.mechanism()
        record = self._monitor.derivation.state() if self._monitor is not None else self._saved_record
        destination["lastiter"] = checkpoint.write(
            self.history, self.registration, self._observed, model_digest, self._void, record
        )
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        """Resume from ``state_dict``. The model's parameters and buffers are checked against the
        state's digest at the next step (and when an epsilon is read before it)."""
        if self._glm is not None:
            self._glm.before_load()
        loaded = checkpoint.read(state_dict, self.registration)
        if loaded.observed is not None and loaded.history and self._monitor is not None:
            checkpoint.check_permutation(
                self.registration, loaded.observed.permutation_digest, self._monitor.facts.permutation_digest
            )
        self.history = loaded.history  # what IAccountant.load_state_dict sets, after the checks above
        self._observed = loaded.observed
        self._resumed = bool(loaded.history)
        self._resume_digest = loaded.model_digest
        self._void = loaded.void
        self._saved_record = loaded.record
        if self._saved_record is not None and self._monitor is not None:
            self._monitor.derivation.restore(self._saved_record)


def _delta(delta: Any) -> float:
    """``delta`` as a float in (0, 1); a 0-dim tensor or array (``torch.tensor(1e-5)``) is its value."""
    from lastiter_plugins.validation import validate_delta

    if isinstance(delta, (torch.Tensor, np.ndarray)) and delta.ndim == 0:
        delta = delta.item()
    return validate_delta(delta)


def register_class(name: str, reg: Registration, force: bool) -> None:
    """Register the configured subclass of :class:`LastIterateAccountant` (with Opacus' registry where it has one)."""
    cls = type(
        f"LastIterateAccountant_{name}",
        (LastIterateAccountant,),
        {"_registration": reg, "__module__": __name__, "__doc__": f"Last-iterate accountant {name!r}."},
    )
    internals.register_accountant(name, cls, force=force)
