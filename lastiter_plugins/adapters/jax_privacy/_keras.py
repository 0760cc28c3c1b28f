r"""The Keras route: the valid epsilon of ``fit`` on a model made private by ``jax_privacy.keras_api``.

:func:`watch` wraps the model's ``fit`` (as ``make_private`` does). Every call is read before its first step
(:mod:`._keras_facts`: the data and how ``fit`` draws it, the optimizer, the rules reading a metric; the linear
model on ``model="glm"``), then run with the recorder of :mod:`._internals` installed: the indices of every batch
fed to the step and the clip, divisor and noise std the step was compiled with. At every epoch's end and after
``fit`` the recorded batches are checked step by step against the scheme (the shared derivation,
``lastiter_plugins/adapters/_derivation.py``) and the learning rate re-read. The pipeline is derived from what was
observed (docs/derivations/jax-privacy-adapter.md, parts 1-3), and :meth:`KerasAccountant.account` is the number for the
pipeline that ran (:func:`lastiter_plugins.host.account`), with jax_privacy's own number beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import weakref
from typing import Any, Literal, NoReturn

import lastiter_plugins as lp
from lastiter_plugins.adapters._derivation import Derivation, DrawnBatch
from lastiter_plugins.config import resolve_relation
from lastiter_plugins.host import Account, Declaration, Departure, HostNumber, account, host_numbers
from lastiter_plugins.validation import validate_delta

from . import _glm, _internals
from ._keras_facts import (
    FitCall,
    FitPlan,
    OptimizerFacts,
    current_learning_rate,
    labels_and_features,
    metric_rules,
    optimizer_departures,
    plan,
    read_optimizer,
)
from ._report import HOST_POISSON, Report
from ._schemes import KerasShape, keras_shape

_VOID = "; the epsilon of this run is void."
_WATCHED: weakref.WeakKeyDictionary[Any, KerasAccountant] = weakref.WeakKeyDictionary()  # one accountant per model


@dataclasses.dataclass(frozen=True)
class Declared:
    """What the user declared to :func:`watch` (validated there)."""

    declaration: Declaration
    delta: float
    relation: lp.Relation | None  # None: the default of the scheme fit runs (resolved at the first fit)
    assumptions: lp.LossAssumptions
    glm: _glm.GlmDeclaration | None
    metric_source: Literal["public"] | None


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """What the compiled step was traced with (docs/derivations/jax-privacy-adapter.md#jp-keras-step)."""

    clip_norm: float
    divisor: float
    rescaled: bool
    physical_noise_multiplier: float  # stddev / l2_norm_bound


class KerasAccountant:
    """The ledger of a watched model's ``fit`` calls (made by :func:`watch`)."""

    def __init__(self, model: Any, declared: Declared) -> None:
        self.model = model
        self.declared = declared
        self.plan: FitPlan | None = None
        self.shape: KerasShape | None = None
        self.optimizer: OptimizerFacts | None = None
        self.mechanism: Mechanism | None = None
        self.assumptions = declared.assumptions
        self.relation: lp.Relation | None = None  # resolved at the first fit, once the scheme is known
        self.derivation: Derivation | None = None
        self.departures: list[Departure] = []
        self.steps = 0  # physical steps checked
        self.planned = 0  # physical steps the fit calls were asked for
        self.stop_rule = False
        self.failure: str | None = None
        self._next_pass = 0
        self._recorder: _internals.Recorder | None = None
        self._pending: list[_internals.Batch] = []
        self._fit = model.fit  # jax_privacy's wrapper of Keras' fit
        model.fit = types.MethodType(_watched_fit(self), model)

    # -- one fit call
    def begin(self, call: FitCall) -> None:
        """Before the first step of a fit call: read and check everything (raises; nothing installed yet)."""
        if self.failure is not None:
            raise lp.PipelineChangedError(self.failure)
        model, dp = self.model, _internals.dp_config(self.model)
        fit_plan = plan(call, dp)
        facts = read_optimizer(model.optimizer)
        if self.plan is None:
            self.plan, self.optimizer = fit_plan, facts
            self.shape = keras_shape(
                fit_plan.sampling, fit_plan.dataset_size, fit_plan.batch_size, fit_plan.batches_per_pass,
                facts.accumulation,
            )  # fmt: skip
            self.relation = resolve_relation(self.declared.relation, fit_plan.sampling)
            self.derivation = Derivation(
                fit_plan.sampling,
                fit_plan.dataset_size,
                fit_plan.batches_per_pass,
                fit_plan.batch_size / fit_plan.dataset_size if fit_plan.sampling is lp.Sampling.POISSON else None,
            )
            if self.declared.glm is not None:
                x, y = labels_and_features(call)
                self.assumptions = _glm.derive(self.declared.glm, model, x, y, float(dp.clipping_norm))
            impossible = lp.impossible_declaration(self.config(1, planning=True), self.assumptions)
            if impossible is not None:  # a real run has real losses
                self.plan = None
                raise lp.NotApplicableError(f"{impossible}. Found them declared to watch(model, ...).")
        else:
            self._same_run(fit_plan, facts)
        step = self.steps + 1
        departures = optimizer_departures(facts, step) if facts != self.optimizer or self.steps == 0 else []
        rules, stops = metric_rules(call, self.declared.metric_source, step)
        self.optimizer = facts
        self._take([*departures, *rules])
        self.stop_rule = self.stop_rule or stops
        self.planned = self.steps + fit_plan.planned_steps
        if self.mechanism is None and getattr(model, "train_function", None) is not None:
            model.train_function = None  # compiled before it was watched: trace it again, with the recorder
        self._recorder = _internals.Recorder(self._next_pass)
        self._recorder.install()

    def _same_run(self, fit_plan: FitPlan, facts: OptimizerFacts) -> None:
        assert self.plan is not None and self.optimizer is not None
        was, now = self.plan, fit_plan
        if (was.sampling, was.dataset_size, was.batch_size, was.batches_per_pass) != (
            now.sampling, now.dataset_size, now.batch_size, now.batches_per_pass,
        ) or facts.accumulation != self.optimizer.accumulation:  # fmt: skip
            raise lp.NotApplicableError(
                "every fit call of a watched model must draw as the first did (one pipeline). Found "
                f"{now.sampling.value}, n = {now.dataset_size}, b = {now.batch_size}, "
                f"{facts.accumulation} batches per update after {was.sampling.value}, n = {was.dataset_size}, "
                f"b = {was.batch_size}, {self.optimizer.accumulation} batches per update. Watch a new model for a "
                "new pipeline."
            )

    def epoch_begin(self) -> None:
        self._check_rate()

    def epoch_end(self) -> None:
        """Check the learning rate and the steps recorded so far (a refusal voids the run)."""
        self._check_rate()
        self._check_steps(final=False)

    def _check_rate(self) -> None:
        """A learning rate other than the one read before: a departure from the first step that may have used it
        (the first step after the last check)."""
        assert self.optimizer is not None
        rate = current_learning_rate(self.model.optimizer)
        if self.optimizer.learning_rate is not None and rate != self.optimizer.learning_rate:
            fact = (
                f"the learning rate changed from {self.optimizer.learning_rate!r} to {rate!r} after step {self.steps}"
            )
            self.optimizer = dataclasses.replace(self.optimizer, learning_rate=rate, not_plain_sgd=(fact,))
            self._take([Departure(step=self.steps + 1, fact=fact, changes={"update": "any"})])

    def end(self, completed: bool) -> None:
        """After fit (``completed``: it returned): remove the recorder, check the rest."""
        recorder = self._recorder
        if recorder is None:
            return
        recorder.remove()
        self._recorder = None
        self._next_pass = recorder.next_pass_id
        if not completed:  # fit's own exception propagates; steps it ran unchecked void the run
            ran = _internals.host_steps(self.model) - self.steps
            if ran and self.failure is None:
                self.failure = f"fit raised after {ran} steps the accountant did not check" + _VOID
            return
        self._check_traced(recorder)
        self._check_steps(final=True)
        self._pending = []  # drawn ahead of a step that never ran
        if getattr(self.model, "stop_training", False) and self.steps < self.planned and not self.stop_rule:
            self._fail(
                f"fit stopped after {self.steps} of {self.planned} planned steps (model.stop_training): a rule chose "
                "the stopping time during the run. Use EarlyStopping on a public validation metric with "
                "metric_source='public' (the epsilon then covers every planned step)" + _VOID
            )

    # -- checks of what ran
    def _check_steps(self, final: bool) -> None:
        recorder = self._recorder
        if recorder is not None:
            self._pending.extend(recorder.take())
        ran = _internals.host_steps(self.model)
        applied = _internals.optimizer_physical_steps(self.model.optimizer)
        if applied != ran:
            self._fail(
                f"every step must be jax_privacy's noisy step. Found {applied} optimizer steps and {ran} noisy steps "
                "(train_on_batch, a custom train_step, or an optimizer used outside fit)" + _VOID
            )
        new = ran - self.steps
        if new > len(self._pending):
            self._fail(
                f"every step must use a batch fit drew from the arrays or from jax_privacy's Poisson dataset. Found "
                f"{new} steps and {len(self._pending)} recorded batches since step {self.steps}" + _VOID
            )
        assert self.derivation is not None and self.plan is not None
        used: list[_internals.Batch] | None = self._pending[:new]
        if self.plan.sampling is lp.Sampling.POISSON:
            used = _in_draw_order(self._pending[:new])
        if used is None:
            self._fail("every Poisson batch jax_privacy drew must feed one step. Found one fed twice" + _VOID)
        for batch in used:
            drawn = DrawnBatch(batch.pass_id, batch.position, batch.indices)
            problem = self.derivation.check_step(drawn, len(batch.indices))
            if problem is not None:
                self._fail(f"{problem}" + _VOID)
            self.steps += 1
        self._pending = self._pending[new:]

    def _check_traced(self, recorder: _internals.Recorder) -> None:
        assert self.plan is not None and self.shape is not None
        found = {
            Mechanism(t.clip_norm, t.normalize_by, t.rescale_to_unit_norm, t.stddev / t.l2_norm_bound)
            for t in recorder.traced
            if t.stddev is not None
        }
        if self.mechanism is not None:
            found.add(self.mechanism)
        if not found:
            if self.steps:
                self._fail("the compiled step must be traced while watched: no clip or noise was recorded" + _VOID)
            return
        if len(found) > 1:
            shown = sorted(map(str, found))
            self._fail(f"every step must add the same noise to the same clipped sum. Found {shown}" + _VOID)
        mechanism = found.pop()
        if mechanism.divisor != self.plan.batch_size:
            self._fail(
                f"the clipped sum must be divided by the batch size b = {self.plan.batch_size}. Found "
                f"normalize_by = {mechanism.divisor}" + _VOID
            )
        self.mechanism = mechanism

    def _take(self, departures: list[Departure]) -> None:
        """Record departures; refused when no row (or the named bound, or require) is left."""
        self.departures.extend(departures)
        if departures and self.plan is not None:
            try:
                self.account(steps=max(self.steps, 1), planning=True)
            except lp.NotApplicableError as exc:
                if self.steps:
                    self._fail(f"{exc}".rstrip(".") + _VOID)
                raise

    def _fail(self, message: str) -> NoReturn:
        self.failure = message
        raise lp.PipelineChangedError(message)

    # -- the numbers
    def config(self, steps: int | None = None, planning: bool = False) -> lp.TrainingConfig:
        """The pipeline that ran (``steps``: physical steps; default the steps checked, or every planned one when a
        stopping rule chose the end)."""
        if self.plan is None or self.shape is None or self.optimizer is None or self.relation is None:
            raise ValueError("no fit call was watched yet: there is no run to account.")
        physical = steps if steps is not None else (max(self.steps, self.planned) if self.stop_rule else self.steps)
        dp = _internals.dp_config(self.model)
        mechanism = self.mechanism
        if mechanism is None:  # before the first trace: what the config says
            if not planning:
                raise ValueError("no step ran yet: there is no run to account.")
            noise = _internals.cached_noise_multiplier(self.model) or dp.noise_multiplier or 1.0
            mechanism = Mechanism(
                float(dp.clipping_norm), float(dp.batch_size), bool(dp.rescale_to_unit_norm),
                noise / math.sqrt(self.shape.accumulation),
            )  # fmt: skip
        rate = self.optimizer.learning_rate
        if rate is not None and mechanism.rescaled:
            rate = rate / mechanism.clip_norm
        return self.shape.scheme.config(
            noise_multiplier=self.shape.noise_multiplier(mechanism.physical_noise_multiplier),
            steps=max(1, self.shape.steps(physical)),
            relation=self.relation,
            learning_rate=rate,
            clip_norm=mechanism.clip_norm,
            update=lp.Update.SGD,
        )

    def account(self, steps: int | None = None, planning: bool = False) -> Account:
        """The number for the pipeline that ran (raises PipelineChangedError for a void run, NotApplicableError
        when no row is left)."""
        if self.failure is not None:
            raise lp.PipelineChangedError(self.failure)
        d = self.declared
        return account(d.declaration, self.config(steps, planning), self.assumptions, d.delta, self.departures)

    def epsilon(self) -> float:
        """``best`` (or the bound asked for) over the rows whose preconditions held at every step."""
        return float(self.account().result.epsilon)

    def host_number(self) -> HostNumber:
        """What jax_privacy's accountant reports for the run (its calibration's view: one Poisson batch of the
        effective batch size per update, the config's noise multiplier), NOT VALID where the run did not sample
        that way (docs/derivations/jax-privacy-adapter.md#jp-host-numbers)."""
        cfg = self.config()
        assert self.plan is not None and self.shape is not None and self.mechanism is not None
        dp = _internals.dp_config(self.model)
        k = self.shape.accumulation
        poisson = lp.TrainingConfig(
            dataset_size=int(dp.train_size),
            batch_size=int(dp.effective_batch_size),
            noise_multiplier=self.mechanism.physical_noise_multiplier * math.sqrt(k),
            steps=max(1, self.steps // k),
            sampling=lp.Sampling.POISSON,
            relation=lp.Relation.ADD_OR_REMOVE_ONE,
            update=lp.Update.ANY,
        )
        (number,) = (h for h in host_numbers(poisson, self.declared.delta, "jax-privacy") if h.id == HOST_POISSON)
        if cfg.sampling is not lp.Sampling.POISSON:
            why = f"its number assumes Poisson sampling; fit drew {cfg.sampling.value} batches ({self.plan.how})"
        elif self.shape.physical:
            why = (
                f"its number assumes one Poisson batch of {dp.effective_batch_size} per update; fit drew {k} "
                "independent Poisson batches"
            )
        else:
            return number
        return dataclasses.replace(number, valid=False, why_not=why)

    def report(self) -> Report:
        """The run, its epsilon, the rows that left and jax_privacy's own number."""
        assert self.plan is not None
        assert self.shape is not None
        note = self.shape.scheme.every_iterate_only or ""
        return Report(self.account(), self.plan.how, self.host_number(), steps=self.steps, note=note)


def _in_draw_order(batches: list[_internals.Batch]) -> list[_internals.Batch] | None:
    """Poisson batches in the order jax_privacy drew them, pass by pass (Keras serves a PyDataset's batches in a
    shuffled order: the same independent draws, permuted), or None when one was fed twice."""
    passes: dict[int, list[_internals.Batch]] = {}
    for batch in batches:
        passes.setdefault(batch.pass_id, []).append(batch)
    out = []
    for group in passes.values():
        if len({b.position for b in group}) != len(group):
            return None
        out += sorted(group, key=lambda b: b.position)
    return out


def _watched_fit(accountant: KerasAccountant) -> Any:
    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        call = FitCall.bind(model, args, kwargs)
        accountant.begin(call)
        callbacks = list(call["callbacks"] or ())
        kwargs = {**call.arguments, "callbacks": [*callbacks, _epoch_check_class()(accountant)]}
        completed = False
        try:
            history = accountant._fit(**kwargs)
            completed = True
        finally:
            accountant.end(completed)
        return history

    return fit


@functools.cache
def _epoch_check_class() -> type:
    """The callback that checks the steps at every epoch's end (fit's own loop; read-only). Made on first use: the
    JAX API must not import Keras, whose backend is chosen when it is first imported."""
    import keras

    class EpochCheck(keras.callbacks.Callback):
        def __init__(self, accountant: KerasAccountant) -> None:
            super().__init__()
            self.accountant = accountant

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.accountant.epoch_begin()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.accountant.epoch_end()

    return EpochCheck


def watch(
    model: Any,
    *,
    delta: float,
    relation: lp.Relation | str | None = None,
    assumptions: lp.LossAssumptions | None = None,
    model_kind: Literal["glm"] | None = None,
    loss: str | None = None,
    feature_norm: float | None = None,
    bound: str = lp.BEST,
    published_only: bool = False,
    require: Literal["last_iterate"] | None = None,
    metric_source: Literal["public"] | None = None,
) -> KerasAccountant:
    r"""Watch the ``fit`` calls of a model made private by ``jax_privacy.keras_api.make_private``.

    Args:
      model: the Keras model (JAX backend) returned by ``make_private``, not trained yet.
      delta: the delta of the epsilon.
      relation: the neighbouring relation (``add_or_remove_one`` or ``replace_one``); left out, the default of the
        scheme fit runs (``lastiter_plugins.config.DEFAULT_RELATION``: add-or-remove for Poisson sampling in fit,
        replace-one for Keras' shuffle), resolved at the first fit.
      assumptions: the loss assumptions the run meets (default: none; ``model_kind="glm"`` derives them).
      model_kind: ``"glm"``: derive the assumptions of a certified linear model (``loss``, ``feature_norm``).
      loss: the linear model's loss family (``binary_logistic``).
      feature_norm: A, every feature row of ``x`` has l2 norm <= A.
      bound, published_only, require: ``best`` (default) or a bound id; ``best`` over published proofs only;
        ``"last_iterate"``: refuse when no last-iterate row is left.
      metric_source: ``"public"``: every rule reading a metric during fit reads public validation data.

    Returns:
      The :class:`KerasAccountant`; ``model.fit`` is wrapped in place.

    Raises:
      UnsupportedHostError: an untested jax_privacy or Keras. ValueError: an invalid declaration, a model not
        made private, not on the JAX backend, or already trained.
    """
    _internals.require_tested_hosts("jax-privacy", "keras")
    import keras

    if keras.config.backend() != "jax":
        raise ValueError(f"the Keras backend must be jax for jax_privacy. Found {keras.config.backend()}.")
    _internals.dp_config(model)
    if model in _WATCHED:
        raise ValueError("model is already watched: one accountant per model.")
    if _internals.host_steps(model):
        raise ValueError(
            f"model must be watched before its first step: it already took {_internals.host_steps(model)} noisy "
            "steps that no accountant saw."
        )
    glm = None
    if model_kind is not None:
        if model_kind != "glm":
            raise ValueError(f"model_kind must be None or 'glm'. Found {model_kind!r}.")
        if assumptions is not None:
            raise ValueError("model_kind='glm' derives the loss assumptions: leave assumptions out.")
        glm = _glm.GlmDeclaration.parse(loss, feature_norm)
    elif loss is not None or feature_norm is not None:
        raise ValueError("loss and feature_norm are for model_kind='glm'. Found them without it.")
    if metric_source not in (None, "public"):
        raise ValueError(f"metric_source must be None or 'public'. Found {metric_source!r}.")
    declared = Declared(
        declaration=Declaration(bound=bound, published_only=published_only, require=require),
        delta=validate_delta(delta),
        relation=None if relation is None else lp.Relation.parse(relation),
        assumptions=assumptions or lp.LossAssumptions(),
        glm=glm,
        metric_source=metric_source,
    )
    accountant = KerasAccountant(model, declared)
    _WATCHED[model] = accountant
    return accountant
