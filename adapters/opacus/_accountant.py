"""The Opacus accountant: verifies every optimizer step against its configuration, then
computes the last-iterate epsilon of the run that actually happened with the core."""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections import OrderedDict
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from opacus.accountants import IAccountant

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._glm import GlmRoute
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts, LoaderWatch, check_data_loader
from lastiter_plugins.adapters.opacus._monitor import MARKS, RunMonitor
from lastiter_plugins.adapters.opacus._observe import (
    ExampleCounter,
    Observed,
    check_dp_optimizer,
    observe,
    planned_run,
    unwrap,
)
from lastiter_plugins.adapters.opacus._registration import (
    LastIterateConfigurationError,
    LastIteratePipelineChangedError,
    Registration,
)
from lastiter_plugins.adapters.opacus._report import Report, build_report
from lastiter_plugins.adapters.opacus._steps import Buffers, StepChecks, digest, tracked_buffers

Sampling = lp.Sampling
_EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
_Error = LastIterateConfigurationError


@dataclasses.dataclass(frozen=True)
class _Binding:
    facts: LoaderFacts
    # set when make_private was called by make_private_with_epsilon: (target_epsilon, target_delta, epochs)
    plan: tuple[float, float, int] | None
    watch: LoaderWatch
    module: Any  # weak reference to the private module, or None
    buffers: Buffers  # the module's buffers at binding, with their values


def _steps_in(history: list) -> int:
    """Steps of an Opacus-format history (one entry while the configuration stays constant)."""
    return int(history[0][2]) if len(history) == 1 else int(sum(entry[2] for entry in history))


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
        if type(self)._registration is None:
            raise TypeError(
                "use lastiter_plugins.adapters.opacus.register(name, ...), then PrivacyEngine(accountant=name) "
                "(Opacus 1.6) or attach(PrivacyEngine(), name)"
            )
        super().__init__()
        declared = type(self)._registration
        #: model="glm": the route that derives the loss assumptions and watches loss and model (one more check)
        self._glm = GlmRoute(declared) if declared.glm is not None else None
        self.history = []
        self._observed: Observed | None = None
        self._binding: _Binding | None = None
        self._resumed = False
        #: after load_state_dict: the digest of the model the checkpoint's state was saved with,
        #: checked at the next step (or None: nothing to check)
        self._resume_digest: str | None = None
        self._counter: ExampleCounter | None = None
        self._checks: StepChecks | None = None
        self._monitor: RunMonitor | None = None
        #: after load_state_dict: the checkpoint's index record (the passes the resumed ones are compared with)
        self._saved_record: dict | None = None
        #: an accountant of this library that accounted earlier steps of the model bound now (continued
        #: at the first step when its configuration is this one's)
        self._prior: LastIterateAccountant | None = None
        self._prior_model: Any = None  # weak reference to the model the prior accountant trained
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
        return self._glm.registration if self._glm is not None else type(self)._registration

    @property
    def derivation(self) -> Any:
        """model="glm": the certificate and the facts it was derived from (None before it was derived)."""
        return None if self._glm is None else self._glm.derivation

    def __len__(self) -> int:
        return len(self.history)

    @property
    def steps(self) -> int:
        """Optimizer steps accounted for so far."""
        return _steps_in(self.history)

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
            self._check_permutation(self._observed.permutation_digest, facts.permutation_digest)
        self._prior = self._earlier_accounting(module)
        reference = None if module is None else weakref.ref(module)
        derivation = self._monitor.derivation if self._monitor is not None and self.steps else None
        self._monitor = RunMonitor(data_loader, facts, derivation)  # before the watch: it records at the sampler
        if self._saved_record is not None and not derivation:
            self._monitor.derivation.restore(self._saved_record)
        self._binding = _Binding(facts, plan, LoaderWatch(data_loader, facts), reference, Buffers(module))
        if self._checks is not None:
            self._checks.remove()
            self._checks = None
        if self._counter is not None and not self._counter.watches(module):
            self._counter.remove()
            self._counter = None
        if module is not None and self._counter is None:
            self._counter = ExampleCounter(module)
        if self._counter is not None:
            self._counter.reset()
        if self.steps == 0:
            self._void = None

    def _earlier_accounting(self, module: Any) -> LastIterateAccountant | None:
        """The accountant of an earlier engine that trained ``module``'s model (None: a fresh model), after
        checking that this one may continue it; marks the model as this accountant's."""
        if module is None:
            return None
        model = unwrap(module)
        prior = MARKS.get(model)
        if prior is None or prior is self or not prior.steps:
            MARKS[model] = self
            return None
        self._prior_model = weakref.ref(model)
        found = (
            f"Found a model already trained for {prior.steps} DP steps by accountant {prior.registration.name!r} "
            "(make_private on a model, or on the GradSampleModule, an earlier engine trained)"
        )
        if prior._void is not None:
            raise _Error(
                f"a model whose earlier DP training was refused cannot be accounted: the released model carries "
                f"those steps. {found}, whose run was void. Start from a fresh model."
            )
        mine, theirs = dict(self.registration.to_dict()), dict(prior.registration.to_dict())
        mine.pop("name"), theirs.pop("name")
        if mine != theirs:
            raise _Error(
                "a model trained by an earlier engine continues that accounting only under the same "
                f"configuration (the released model is the output of all its steps). {found}, registered as "
                f"{theirs}; this accountant is {mine}. Register the same configuration, or start from a fresh "
                "model (initial weights must not depend on the private data)."
            )
        return prior

    def _continue_prior(self, observed: Observed) -> None:
        """The first step of a model an earlier accountant trained: continue its accounting (its history,
        its index record) when the step is configured as its steps were, else refuse."""
        prior, self._prior = self._prior, None
        if prior._void is not None:
            raise _Error(f"the earlier accounting of this model was refused: {prior._void}")
        if prior._observed != observed:
            raise _Error(
                f"a model trained by an earlier engine continues that accounting only with the same noise, clipping, "
                f"batch size and learning rate. Found {prior._observed.to_dict()} for its {prior.steps} steps and "
                f"{observed.to_dict()} now. Start from a fresh model, or train with the same settings."
            )
        self.history = deepcopy(prior.history)
        if prior._monitor is not None:
            self._monitor.derivation = prior._monitor.derivation
        model = self._prior_model()
        if model is not None:
            MARKS[model] = self
        prior._void = (
            f"the model it accounted for was trained further under accountant {self.registration.name!r}, which "
            "continues its accounting; read the epsilon there"
        )

    def _check_permutation(self, saved: str | None, current: str | None) -> None:
        if saved != current:
            raise _Error(
                f"a run with sampling={self.registration.sampling.value} must resume with the same permutation: the "
                "shuffle-once bound assumes one permutation for the whole run. Found a ShuffleOnceSampler whose "
                f"permutation differs from the checkpoint's (digest {str(current)[:12]} vs {str(saved)[:12]}). "
                "Build the ShuffleOnceSampler with the seed of the interrupted run."
            )

    def get_optimizer_hook_fn(self, sample_rate: float):
        internals.require_tested_opacus()
        caller = internals.engine_locals("make_private")
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

        if self._glm is not None:
            glm = self._glm

            def hook_fn(optim: Any) -> None:
                glm.check_step(optim)
                self._account_step(optim)

            return hook_fn
        return self._account_step  # called by the DP optimizer at every step (a bound method: one call less)

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
        reg, binding, steps = self.registration, self._binding, self.steps
        if binding is None:
            raise _Error(
                f"accountant {reg.name!r} has not seen the data loader, so the declared sampling={reg.sampling.value} "
                "cannot be verified. Create the optimizer with Opacus' PrivacyEngine.make_private, or call "
                "engine.accountant.bind_data_loader(data_loader, module=model) before training."
            )
        if self._checks is None:
            module = binding.module() if binding.module is not None else None
            self._checks = StepChecks(optim, module, binding.buffers, reg)
        checks = self._checks
        checks.verify_optimizer(optim, steps + 1)  # the same DP optimizer, SGD and parameters; nothing after us
        observed = observe(optim, reg, binding.facts)  # noise, clipping, reduction, lr: plain SGD
        if self._prior is not None:  # the model was trained by an earlier engine: continue or refuse
            self._continue_prior(observed)
            steps = self.steps
        self._verify_constant(observed, steps)  # ... the same as at the first step
        change = binding.watch.changed()  # the loader bound at make_private; one shuffle-once permutation
        if change is not None:
            raise LastIteratePipelineChangedError(f"{change} (step {steps + 1}).")
        gradients = checks.verify_examples(optim, binding.watch, self._counter)
        problem = self._monitor.check_step(gradients, (optim, optim.original_optimizer))  # the batch it used
        if problem is not None:
            raise LastIteratePipelineChangedError(f"{problem} (step {steps + 1}).")
        if self._resume_digest is not None:  # the first step after load_state_dict: the checkpoint's model
            self._verify_resumed_model(steps)
            checks.rebase()
        checks.verify_model(steps)  # parameters and buffers changed only by the accounted steps
        self._observed = observed
        self._resumed = False
        checks.mark_pending()
        self.step(noise_multiplier=observed.noise_multiplier, sample_rate=observed.sample_rate)

    def _model_tensors(self) -> list[torch.Tensor] | None:
        """The private module's parameters and tracked buffers (without a module: the trained parameters)."""
        module = self._binding.module() if self._binding is not None and self._binding.module is not None else None
        if module is not None:
            return [*module.parameters(), *(b for *_, b in tracked_buffers(module))]
        return None if self._checks is None else list(self._checks.params)

    def _verify_resumed_model(self, steps: int) -> None:
        problem = self._loaded_model_differs()
        if problem is not None:
            raise LastIteratePipelineChangedError(
                f"{problem} (at the first step after load_state_dict, step {steps + 1}), or a buffer updated by "
                "the forward pass. Load the model and the accountant from the same checkpoint "
                "(PrivacyEngine.load_checkpoint does)."
            )
        self._resume_digest = None

    def _check_loaded_model(self) -> None:
        """Before the first step after load_state_dict, an epsilon is about the checkpoint's model only."""
        problem = self._loaded_model_differs()
        if problem is not None:
            raise _Error(
                f"{problem}. The epsilon loaded is that of the checkpoint's model. Load the model's weights from "
                "the same checkpoint as the accountant's state (PrivacyEngine.load_checkpoint does)."
            )

    def _loaded_model_differs(self) -> str | None:
        tensors = self._model_tensors()
        if tensors is None:  # nothing bound yet to compare with: the number is the checkpoint's model's
            return None
        found = digest(tensors)
        if found == self._resume_digest:
            return None
        return (
            f"the model's parameters and buffers must be those the accountant's state was saved with, after its "
            f"{self.steps} steps. Found others (digest {found[:12]} vs {self._resume_digest[:12]}): weights of "
            "another checkpoint (a later one's steps are not in this state) or weights changed after loading"
        )

    def _verify_constant(self, observed: Observed, steps: int) -> None:
        if self._resumed and self._observed is not None:
            self._check_permutation(self._observed.permutation_digest, observed.permutation_digest)
        if self._observed is not None and observed != self._observed:
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
        if self._observed is None and self._binding.plan is not None:
            self._check_plan(observed, self._binding.plan)

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
                self._check_loaded_model()
            elif self._checks is not None:  # nothing may have changed the model since the last step
                try:
                    self._checks.verify_model(self.steps, release=True)
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

    def get_privacy_spent(self, *, delta: float) -> tuple[float, float]:
        """(epsilon, optimal order), like Opacus' RDPAccountant."""
        result = self.epsilon_result(delta)
        return (0.0, 0.0) if result is None else (float(result.epsilon), float(result.order))

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
        if self._void is None and self._checks is not None and self.history and self._resume_digest is None:
            try:  # a model written since the last step is not the accounted run's: the state says so
                self._checks.verify_model(self.steps, release=True)
            except LastIteratePipelineChangedError as exc:
                self._void = str(exc)
        tensors = self._model_tensors()
        model_digest = self._resume_digest if self._resume_digest is not None or tensors is None else digest(tensors)
        # Opacus' two keys, written here (as Opacus 1.6 does; 1.5's IAccountant stores the mechanism method)
        destination = destination if destination is not None else OrderedDict()
        destination["history"] = deepcopy(self.history)
        destination["mechanism"] = self.mechanism()
        destination["lastiter"] = {
            "format": 3,
            "registration": self.registration.to_dict(),
            "observed": None if self._observed is None else self._observed.to_dict(),
            "model_digest": model_digest if self.history else None,
            "void": self._void,
            "record": self._monitor.derivation.state() if self._monitor is not None else self._saved_record,
        }
        return destination

    def load_state_dict(self, state_dict: Any) -> None:
        """Resume from ``state_dict``. The model's parameters and buffers are checked against the
        state's digest at the next step (and when an epsilon is read before it)."""
        if self._glm is not None:
            self._glm.before_load()
        reg = self.registration
        if not state_dict or "lastiter" not in state_dict:
            raise _Error(
                f"state_dict must come from a last-iterate accountant (key 'lastiter'). Found keys "
                f"{sorted(state_dict or {})}."
            )
        if state_dict.get("mechanism") != reg.name:
            raise _Error(
                f"state_dict of {state_dict.get('mechanism')!r} cannot be loaded into accountant {reg.name!r}."
            )
        extra = state_dict["lastiter"]
        if extra.get("registration") != reg.to_dict():
            raise _Error(
                f"the checkpoint was accounted under a different configuration of {reg.name!r}: "
                f"{extra.get('registration')} vs now {reg.to_dict()}. Register the same configuration to resume."
            )
        history = [(float(z), float(q), int(steps)) for z, q, steps in state_dict.get("history", [])]
        if history and not extra.get("model_digest"):
            raise _Error(
                f"state_dict must hold a digest of the model after its {_steps_in(history)} steps (format 3), so "
                "that the weights loaded with it can be checked. Found a state of format "
                f"{extra.get('format', 1)} without one (saved by an earlier version of lastiter-plugins). Resume "
                "from a checkpoint saved by this version, or start the run again."
            )
        observed = None if extra.get("observed") is None else Observed.from_dict(extra["observed"])
        if observed is not None and history and self._binding is not None:
            self._check_permutation(observed.permutation_digest, self._binding.facts.permutation_digest)
        self.history = history  # what IAccountant.load_state_dict sets, after the checks above
        self._observed = observed
        self._resumed = bool(history)
        self._resume_digest = extra["model_digest"] if history else None
        self._void = extra.get("void")
        self._saved_record = extra.get("record") if history else None  # (absent from states of earlier versions)
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
