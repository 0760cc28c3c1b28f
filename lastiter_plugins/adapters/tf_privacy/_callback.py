r"""``LastIterateCallback``: last-iterate accounting for ``model.fit`` with TF Privacy's DP-SGD
optimizers. A thin callback: :mod:`._observe` records what fit was called with and what each step
used, :mod:`._derive` derives the planned run from that and compares every step with it."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

import lastiter_plugins as lp
from lastiter_plugins import LossAssumptions, PipelineChangedError, Relation, Sampling, TrainingConfig
from lastiter_plugins.config import refuse_renamed, resolve_relation
from lastiter_plugins.validation import validate_delta, validate_orders

from . import _derive as derive
from . import _glm
from . import _observe as observe
from ._errors import AccountingError

#: Models a LastIterateCallback has trained (their weights carry the earlier run).
_TRAINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class LastIterateCallback(tf.keras.callbacks.Callback):
    r"""Last-iterate accounting for ``model.fit`` with TF Privacy's DP-SGD optimizers.

    Pass it to ``model.fit(x, y, batch_size=b, shuffle=..., callbacks=[...])``
    with in-memory arrays. Before the first step it reads and checks the
    optimizer, fit's data pipeline and the model, and checks that the chosen
    bound applies to the planned run. It then instruments the compiled step,
    which records one row of facts per step, and checks every row against the
    plan at the end of every epoch, at the end of training and whenever the
    epsilon is read (one transfer per check, none per batch): the rows of the
    batch, the loss weights fed to it, the length of the loss vector TF Privacy
    clips per entry, the clip norm, the noise std and the learning rate the step
    used (tf.Variable-backed values included), the optimizer's step count, that
    nothing but the DP update changed a weight (trainable or not) inside the
    step, that the step started where the previous one ended (or from its
    projection) and, with a projection, inside the ball. It also checks the
    optimizer object, the trainable variables and that the DP optimizer
    differentiated all of them, and, once training ended, that the model still
    holds the last step's weights. Any mismatch raises
    ``lastiter_plugins.PipelineChangedError`` naming the step, and voids the
    epsilon.

    ``epsilon`` covers the FINAL model only (``composition`` excepted, which
    covers every iterate) under the declared neighbouring relation. It covers
    a number of steps and a learning rate fixed before training
    (``EarlyStopping``, ``TerminateOnNaN`` and ``ReduceLROnPlateau`` are
    refused; ``model.stop_training`` voids it), and describes the model only
    while it takes no step it did not count.

    Args:
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``).
      published_only: ``best`` over bounds whose proof is a published theorem for this run (not
        this library's derivations; a named bound must be one); refused before the first step if
        none applies.
      sampling: what fit does: ``reshuffle`` for ``shuffle=True`` (Keras'
        default), ``cyclic`` for ``shuffle=False`` (``shuffle_once`` with
        ``shuffle=False`` when the arrays were permuted once at random, in
        secret, before fit; ``reshuffle`` is accepted with ``shuffle=False``
        too, since every bound proven for reshuffling holds for every order).
      dataset_size: n, the number of training examples (checked against fit).
      delta: the target delta.
      smoothness, weak_convexity, strong_convexity, gradient_norms_within_clip,
        clipped_loss_convex_smooth: the loss assumptions (see
        :class:`lastiter_plugins.LossAssumptions`); they must hold for the
        per-example loss Keras passes to the optimizer. ``l2_outside_clip``
        is refused: TF Privacy's optimizers add no l2 term outside the clip.
      diameter: D of the projection; requires exactly one
        :class:`ProjectionCallback` with diameter <= D in the same fit call.
      relation: ``replace_one`` or ``add_or_remove_one``. Default: the sampling scheme's
        (``lastiter_plugins.config.DEFAULT_RELATION``, the rule of every route): ``replace_one`` for the
        schemes Keras runs, the only relation their bounds are proven for.
      orders: Renyi orders (default: the library's grid).
      model: ``"glm"`` derives the loss assumptions instead of taking them (a certified linear model:
        one trainable ``Dense`` without activation, fed by a ``FeatureNormClip``, and the loss read from
        ``model.compile``; see docs/tf_privacy.md); the assumption arguments above must then be
        left out (``diameter`` stays, with a ``ProjectionCallback``).
      feature_norm: with ``model="glm"``: A, the bound of the ``FeatureNormClip``.

    Raises:
      ValueError: invalid arguments (at construction), ``clipping=`` (renamed).
      UnsupportedHostError: a TF / Keras / TF Privacy version it was not tested with.
      AccountingError: a setting the bounds do not cover (before the first step).
      PipelineChangedError: a step differed from the plan (during training), or
        steps the callback did not count (when reading ``epsilon``).
      NotApplicableError: the chosen bound does not apply to the planned run.
    """

    def __init__(
        self,
        *,
        bound: str = lp.BEST,
        sampling: str | Sampling,
        dataset_size: int,
        delta: float,
        smoothness: float | None = None,
        weak_convexity: float = 0.0,
        strong_convexity: float = 0.0,
        diameter: float | None = None,
        gradient_norms_within_clip: bool = False,
        clipped_loss_convex_smooth: bool = False,
        l2_outside_clip: bool = False,
        relation: str | Relation | None = None,
        orders: Sequence[float] | None = None,
        model: str | None = None,
        feature_norm: float | None = None,
        published_only: bool = False,
        **renamed: Any,
    ) -> None:
        super().__init__()
        gradient_norms_within_clip = derive.flag(gradient_norms_within_clip)
        clipped_loss_convex_smooth = derive.flag(clipped_loss_convex_smooth)
        refuse_renamed(renamed)
        if renamed:
            raise TypeError(f"LastIterateCallback got an unexpected keyword argument {next(iter(renamed))!r}.")
        observe.check_host()
        if bound not in lp.BOUND_IDS:
            raise ValueError(f"bound must be one of {', '.join(lp.BOUND_IDS)}. Found {bound!r}.")
        self.bound = bound
        self.sampling = Sampling.parse(sampling)
        if self.sampling not in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE):
            raise ValueError(
                "sampling must be cyclic, shuffle_once or reshuffle: Keras fit passes over the data in "
                f"epochs and cannot sample random batches or Poisson batches. Found {self.sampling.value}."
            )
        if derive.flag(l2_outside_clip) is not False:
            raise ValueError(
                "l2_outside_clip must be False under TF Privacy: its DP optimizers add no l2 term to the noisy "
                "clipped mean (Keras' decay and weight decay are refused; an l2 term in the loss is clipped with "
                f"it, and kernel_regularizer fails with a per-example loss). Found l2_outside_clip={l2_outside_clip!r}."
            )
        TrainingConfig(dataset_size=dataset_size, batch_size=1, noise_multiplier=1.0, steps=1, sampling=self.sampling)
        self.dataset_size = int(dataset_size)
        self.delta = validate_delta(delta)
        self.relation = resolve_relation(relation, self.sampling)
        given = {
            "smoothness": smoothness is not None,
            "weak_convexity": weak_convexity != 0.0,
            "strong_convexity": strong_convexity != 0.0,
            "gradient_norms_within_clip": gradient_norms_within_clip is not False,
            "clipped_loss_convex_smooth": clipped_loss_convex_smooth is not False,
        }
        self._glm = _glm.declare(model=model, feature_norm=feature_norm, declared=given)
        self.assumptions = LossAssumptions(
            smoothness=smoothness,
            weak_convexity=weak_convexity,
            strong_convexity=strong_convexity,
            diameter=diameter,
            gradient_norms_within_clip=gradient_norms_within_clip,
            clipped_loss_convex_smooth=clipped_loss_convex_smooth,
        )
        self.orders = validate_orders(orders)
        if not isinstance(derive.flag(published_only), bool):
            raise ValueError(f"published_only must be True or False. Found {published_only!r}.")
        self.published_only = bool(published_only)  # best over published theorems only
        self._used = False
        self._reset()

    def _reset(self) -> None:
        self._plan: derive.Plan | None = None
        self._steps = 0
        self._failure: str | None = None
        self._cache: lp.EpsilonResult | None = None
        self._probe: observe.StepProbe | None = None
        self._glm_probe: _glm.Probe | None = None
        self._ended = False
        self.glm_structure: _glm.Structure | None = None  # model="glm": what the constants were derived from

    # -- reading ------------------------------------------------------------

    @property
    def optimizer_settings(self) -> derive.DPOptimizerSettings | None:
        """What the DP optimizer was found to do (None before fit)."""
        return None if self._plan is None else self._plan.optimizer

    @property
    def fit_settings(self) -> derive.FitSettings | None:
        """What fit was found to do with the data (None before fit)."""
        return None if self._plan is None else self._plan.fit

    @property
    def steps(self) -> int:
        """Optimizer steps counted and checked so far: the steps recorded since the last check are checked
        up to the first that differs from the plan (which the next check, or reading the epsilon, raises)."""
        if self._failure is None and self._probe is not None:
            self._problem(self._probe)
        return self._steps

    @property
    def config(self) -> TrainingConfig:
        """The TrainingConfig of the steps counted so far."""
        return self._check_usable().config.replace(steps=self._steps)

    @property
    def result(self) -> lp.EpsilonResult:
        """The labelled guarantee (render it with ``str(result)`` or ``result.to_dict()``)."""
        self._check_usable()
        if self._cache is None or self._cache.steps != self._steps:
            self._cache = lp.epsilon(
                self.bound,
                self.delta,
                self.orders,
                published_only=self.published_only,
                config=self.config,
                assumptions=self.assumptions,
            )
        return self._cache

    @property
    def epsilon(self) -> float:
        """Epsilon at ``delta`` for the final model after the steps counted so far."""
        return self.result.epsilon

    def _check_usable(self) -> derive.Plan:
        """The plan, once steps were counted and nothing voids their epsilon."""
        self._verify()
        plan = self._plan
        if plan is None or self._steps == 0:
            raise AccountingError("no optimizer step has been counted yet: train with model.fit first.")
        problem = derive.usable_problem(plan, getattr(self.model, "optimizer", None), self._steps)
        if problem is not None:
            raise PipelineChangedError(problem)
        departure = None
        if self._ended:
            assert self._probe is not None  # made with the plan; removed from the step at the end, still readable
            departure = self._probe.departure()
        problem = derive.final_problem(plan, departure)
        if problem is not None:
            self._fail(problem)
        return plan

    def _verify(self) -> None:
        """Check the steps recorded since the last check (one read of the step table) and the host's facts;
        a mismatch voids the epsilon and raises PipelineChangedError."""
        if self._failure is not None:
            raise PipelineChangedError(self._failure)
        if self._probe is not None:
            problem = self._problem(self._probe)
            if problem is not None:
                self._fail(problem)

    def _problem(self, probe: observe.StepProbe) -> str | None:
        """The first problem of the steps recorded since the last check (None when none); advances the count
        of checked steps over every step found correct. Once training ended every step was checked: later
        training is what ``_check_usable`` refuses."""
        if self._ended:
            return None
        assert self._plan is not None  # the probe is made with the plan
        record = probe.read()
        more = None
        glm_probe = self._glm_probe
        if glm_probe is not None:
            glm = glm_probe.read()
            if glm.steps != record.steps:
                return f"the GLM checks recorded {glm.steps} steps and the step checks {record.steps}" + derive.VOID

            def more(k: int) -> str | None:
                return glm_probe.problem(k, glm.row(k))

        host = observe.host_facts(self.model, probe)
        self._steps, problem = derive.steps_problem(self._plan, record, self._steps, host, more)
        return problem

    def _fail(self, message: str) -> None:
        self._failure = message
        self._remove_probe()
        raise PipelineChangedError(message)

    def _remove_probe(self) -> None:
        """Unwrap the step (the GLM probe wraps the core probe's train_step wrapper: removed first) and drop
        the train function compiled with the wrappers, so that later training does not run them; the
        probes' records stay readable."""
        if self._glm_probe is not None:
            self._glm_probe.remove()
        if self._probe is not None:
            self._probe.remove()
            self.model.train_function = None

    # -- the Keras hooks ----------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        model = self.model
        if self._used:
            raise AccountingError(
                "a LastIterateCallback accounts one fit call: this one already accounted a run, and a new fit "
                "starts from the model that run trained, which its epsilon alone does not cover. Train in one "
                "fit call, or account the runs together (each run's RDP adds: "
                "lastiter_plugins.adapters.dp_accounting composes them). Found a second on_train_begin."
            )
        self._reset()
        settings, fit = derive.pipeline(
            model,
            dataset_size=self.dataset_size,
            sampling=self.sampling,
            relation=self.relation,
            trained_steps=_TRAINED.get(model),
        )
        if self._glm is not None:  # model="glm": derive the assumptions (diameter stays declared)
            self.assumptions, self.glm_structure = _glm.derive(
                self._glm, model, clip_norm=_glm.clip_as_run(settings.l2_norm_clip), diameter=self.assumptions.diameter
            )
        self._plan = derive.plan(
            model,
            settings,
            fit,
            sampling=self.sampling,
            relation=self.relation,
            assumptions=self.assumptions,
            bound=self.bound,
            delta=self.delta,
            orders=self.orders,
            published_only=self.published_only,
        )
        self._used = True
        self._probe = observe.StepProbe(model, model.optimizer, self._plan.ball, capacity=fit.steps_per_epoch)
        if self.glm_structure is not None:
            self._glm_probe = _glm.Probe(model, self.glm_structure, capacity=fit.steps_per_epoch)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._plan is not None and self._failure is None:
            self._verify()  # catches a change made before the epoch's first step (a LearningRateScheduler)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._plan is None or self._failure is not None:
            return
        self._verify()
        problem = derive.epoch_problem(self._plan, self._steps, bool(getattr(self.model, "stop_training", False)))
        if problem is not None:
            self._fail(problem)
        if logs is not None and self._steps:
            logs["epsilon"] = self.epsilon

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._plan is None or self._failure is not None:
            return
        self._verify()
        self._remove_probe()
        self._ended = True
        _TRAINED[self.model] = self._steps
        problem = derive.end_problem(self._plan, self._steps, bool(getattr(self.model, "stop_training", False)))
        if problem is None:
            problem = derive.final_problem(self._plan, None)
        if problem is not None:
            self._fail(problem)
