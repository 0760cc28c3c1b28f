r"""``LastIterateCallback``: last-iterate accounting for ``model.fit`` with TF Privacy's DP-SGD
optimizers, checked at every step against what the compiled step actually did."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import lastiter_plugins as lp
from lastiter_plugins import LossAssumptions, PipelineChangedError, Relation, Sampling, TrainingConfig
from lastiter_plugins.config import refuse_renamed
from lastiter_plugins.conversion import validate_delta, validate_orders

from . import _config as conf
from . import _glm
from . import _internals as internals
from ._config import AccountingError
from ._projection import ProjectionCallback

#: Models a LastIterateCallback has trained (their weights carry the earlier run).
_TRAINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_VOID = "; the epsilon of this run is void."


class LastIterateCallback(tf.keras.callbacks.Callback):
    r"""Last-iterate accounting for ``model.fit`` with TF Privacy's DP-SGD optimizers.

    Pass it to ``model.fit(x, y, batch_size=b, shuffle=..., callbacks=[...])``
    with in-memory arrays. Before the first step it reads and checks the
    optimizer, fit's data pipeline and the model, and checks that the chosen
    bound applies to the planned run. It then instruments the compiled step,
    which records one row of facts per step, and checks every row against the
    plan at the end of every epoch, at the end of training and whenever the
    epsilon is read (one transfer per check, none per batch): the rows of the
    batch, the length of the loss vector TF Privacy clips per entry, the clip
    norm, the noise std and the learning rate the step used (tf.Variable-backed
    values included), the optimizer's step count, that nothing but the DP
    update changed a weight (trainable or not) inside the step, that the step
    started where the previous one ended (or from its projection) and, with a
    projection, inside the ball. It also checks the optimizer object, the
    trainable variables and that the DP optimizer differentiated all of them,
    and, once training ended, that the model still holds the last step's
    weights. Any mismatch raises ``lastiter_plugins.PipelineChangedError``
    naming the step, and voids the epsilon.

    ``epsilon`` covers the FINAL model only (``composition`` excepted, which
    covers every iterate) under the declared neighbouring relation. It covers
    a number of steps fixed before training (``EarlyStopping`` and
    ``TerminateOnNaN`` are refused; ``model.stop_training`` voids it), and
    describes the model only while it takes no step it did not count.

    Args:
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``).
      sampling: what fit does: ``reshuffle`` for ``shuffle=True`` (Keras'
        default), ``cyclic`` for ``shuffle=False`` (``shuffle_once`` with
        ``shuffle=False`` when the arrays were permuted once at random, in
        secret, before fit; ``reshuffle`` is accepted with ``shuffle=False``
        too, since every bound proven for reshuffling holds for every order).
      dataset_size: n, the number of training examples (checked against fit).
      delta: the target delta.
      smoothness, weak_convexity, strong_convexity, gradient_norms_within_clip:
        the loss assumptions (see :class:`lastiter_plugins.LossAssumptions`);
        they must hold for the per-example loss Keras passes to the optimizer.
      diameter: D of the projection; requires exactly one
        :class:`ProjectionCallback` with diameter <= D in the same fit call.
      relation: ``replace_one`` (default) or ``add_or_remove_one``.
      orders: Renyi orders (default: the library's grid).
      model: ``"glm"`` derives the loss assumptions instead of taking them (a certified linear model:
        one trainable ``Dense`` without activation, fed by a ``FeatureNormClip``, and the loss read from
        ``model.compile``; see docs/tf_privacy.md); the four assumption arguments above must then be
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
        relation: str | Relation = Relation.REPLACE_ONE,
        orders: Sequence[float] | None = None,
        model: str | None = None,
        feature_norm: float | None = None,
        **renamed: Any,
    ) -> None:
        super().__init__()
        gradient_norms_within_clip = conf.flag(gradient_norms_within_clip)
        refuse_renamed(renamed)
        if renamed:
            raise TypeError(f"LastIterateCallback got an unexpected keyword argument {next(iter(renamed))!r}.")
        internals.check_host()
        if bound not in lp.BOUND_IDS:
            raise ValueError(f"bound must be one of {', '.join(lp.BOUND_IDS)}. Found {bound!r}.")
        self.bound = bound
        self.sampling = Sampling.parse(sampling)
        if self.sampling not in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE):
            raise ValueError(
                "sampling must be cyclic, shuffle_once or reshuffle: Keras fit passes over the data in "
                f"epochs and cannot sample random batches or Poisson batches. Found {self.sampling.value}."
            )
        TrainingConfig(dataset_size=dataset_size, batch_size=1, noise_multiplier=1.0, steps=1, sampling=self.sampling)
        self.dataset_size = int(dataset_size)
        self.delta = validate_delta(delta)
        self.relation = Relation.parse(relation)
        given = {
            "smoothness": smoothness is not None,
            "weak_convexity": weak_convexity != 0.0,
            "strong_convexity": strong_convexity != 0.0,
            "gradient_norms_within_clip": gradient_norms_within_clip is not False,
        }
        self._glm = _glm.declare(model=model, feature_norm=feature_norm, declared=given)
        self.assumptions = LossAssumptions(
            smoothness=smoothness,
            weak_convexity=weak_convexity,
            strong_convexity=strong_convexity,
            diameter=diameter,
            gradient_norms_within_clip=gradient_norms_within_clip,
        )
        self.orders = validate_orders(orders)
        self._used = False
        self._reset()

    def _reset(self) -> None:
        self.optimizer_settings: conf.DPOptimizerSettings | None = None
        self.fit_settings: conf.FitSettings | None = None
        self._template: TrainingConfig | None = None
        self._start_iterations = 0
        self._steps = 0
        self._failure: str | None = None
        self._cache: lp.EpsilonResult | None = None
        self._optimizer: Any = None
        self._probe: internals.StepProbe | None = None
        self._projection: ProjectionCallback | None = None
        self._trainable_ids: tuple[int, ...] = ()
        self._weight_ids: tuple[int, ...] = ()
        self._moved_tolerance = 0.0
        self._ended = False
        self._glm_probe: _glm.Probe | None = None
        self.glm_structure: _glm.Structure | None = None  # model="glm": what the constants were derived from

    # -- reading ------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Optimizer steps counted and checked so far: the steps recorded since the last check are checked
        up to the first that differs from the plan (which the next check, or reading the epsilon, raises)."""
        if self._failure is None and self._probe is not None:
            self._problem()
        return self._steps

    @property
    def config(self) -> TrainingConfig:
        """The TrainingConfig of the steps counted so far."""
        self._check_usable()
        return self._template.replace(steps=self._steps)

    @property
    def result(self) -> lp.EpsilonResult:
        """The labelled guarantee (render it with ``str(result)`` or ``result.to_dict()``)."""
        self._check_usable()
        if self._cache is None or self._cache.steps != self._steps:
            self._cache = lp.compute_epsilon(self.bound, self.config, self.assumptions, self.delta, self.orders)
        return self._cache

    @property
    def epsilon(self) -> float:
        """Epsilon at ``delta`` for the final model after the steps counted so far."""
        return self.result.epsilon

    def _check_usable(self) -> None:
        self._verify()
        if self._template is None or self._steps == 0:
            raise AccountingError("no optimizer step has been counted yet: train with model.fit first.")
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not self._optimizer:
            raise PipelineChangedError(
                "model.optimizer must be the optimizer whose steps this callback counted: the model was "
                "compiled again, so steps taken with the new optimizer are not accounted. Found "
                f"{type(optimizer).__name__} object {id(optimizer):#x}, not the accounted one "
                f"{id(self._optimizer):#x}; account the whole training in one fit call with this callback."
            )
        expected = self._start_iterations + self._steps
        iterations = int(optimizer.iterations.numpy())
        if iterations > expected:
            raise PipelineChangedError(
                f"model.optimizer.iterations must equal the {expected} steps this callback counted: the "
                f"model took {iterations - expected} optimizer step(s) it did not see (a later fit or "
                "train_on_batch without this callback, or a custom training loop), so the epsilon would describe "
                f"fewer steps than the model took. Found iterations={iterations}; account the whole training in "
                "one fit call with this callback."
            )
        if iterations < expected:
            raise PipelineChangedError(
                f"model.optimizer.iterations must equal the {expected} steps this callback counted: the "
                f"step count was set back (a restored optimizer state?). Found iterations={iterations}."
            )
        self._check_final_in_ball()
        if self._ended:
            self._check_final_weights()

    def _verify(self) -> None:
        """Check the steps recorded since the last check (one read of the step table) and the host's facts;
        a mismatch voids the epsilon and raises PipelineChangedError."""
        if self._failure is not None:
            raise PipelineChangedError(self._failure)
        if self._probe is not None:
            problem = self._problem()
            if problem is not None:
                self._fail(problem)

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
        settings = conf.read_dp_optimizer(model.optimizer)
        fit = conf.read_fit(model)
        if fit.dataset_size != self.dataset_size:
            raise AccountingError(
                f"dataset_size must equal the number of examples fit trains on = {fit.dataset_size} "
                f"(after validation_split). Found dataset_size={self.dataset_size}."
            )
        conf.check_sampling(self.sampling, fit, self.relation)
        conf.check_microbatches(settings, fit.batch_size)
        iterations = int(model.optimizer.iterations.numpy())
        if iterations != 0:
            raise AccountingError(
                "the optimizer must be fresh (iterations = 0): its earlier steps would not be accounted. "
                f"Found iterations={iterations}; compile the model with a new optimizer."
            )
        if model in _TRAINED:
            raise AccountingError(
                f"the model must not have been trained before: a LastIterateCallback already accounted "
                f"{_TRAINED[model]} steps on it, and this run would start from their result, which its epsilon "
                "does not cover. Train in one fit call, or compose the runs' RDP (the dp-accounting adapter "
                "does). Found a model trained by an earlier accounted fit."
            )
        conf.check_model(model)
        if self._glm is not None:  # model="glm": derive the assumptions (diameter stays declared)
            self.assumptions, self.glm_structure = _glm.derive(
                self._glm, model, clip_norm=_glm.clip_as_run(settings.l2_norm_clip), diameter=self.assumptions.diameter
            )
        self._projection = self._check_projection(fit)
        conf.check_stopping(fit.callbacks)
        planned_steps = fit.epochs * fit.steps_per_epoch
        template = TrainingConfig(
            dataset_size=fit.dataset_size,
            batch_size=fit.batch_size,
            noise_multiplier=settings.noise_multiplier,
            steps=planned_steps,
            sampling=self.sampling,
            learning_rate=settings.learning_rate,
            clip_norm=settings.l2_norm_clip,
            relation=self.relation,
        )
        # Refuse before the first step when the bound does not apply to the planned run.
        lp.compute_epsilon(self.bound, template, self.assumptions, self.delta, self.orders)
        self.optimizer_settings, self.fit_settings, self._template = settings, fit, template
        self._optimizer = model.optimizer
        self._trainable_ids = tuple(id(v) for v in model.trainable_variables)
        self._weight_ids = tuple(id(v) for v in model.weights)
        self._used = True
        ball = None
        if self._projection is not None:
            self._projection._set_center()
            ball = internals.Ball(self._projection.center, self._projection.radius, ProjectionCallback.MARGIN)
            # float32 rounding of the projection, relative to the ball's size; 0 without a projection
            self._moved_tolerance = _TOLERANCE * (self._projection.radius + _center_norm(self._projection))
        self._probe = internals.StepProbe(model, model.optimizer, ball, capacity=fit.steps_per_epoch)
        if self.glm_structure is not None:
            self._glm_probe = _glm.Probe(model, self.glm_structure, capacity=fit.steps_per_epoch)

    def _check_projection(self, fit: conf.FitSettings) -> ProjectionCallback | None:
        projections = [cb for cb in fit.callbacks if isinstance(cb, ProjectionCallback)]
        declared = self.assumptions.diameter
        if declared is None:
            if projections:
                raise AccountingError(
                    "diameter must be declared when a ProjectionCallback is used (the bounds must know "
                    f"the update projects). Found a ProjectionCallback of diameter {projections[0].diameter:g} "
                    "and diameter=None."
                )
            return None
        if len(projections) != 1:
            raise AccountingError(
                f"diameter={declared:g} needs exactly one ProjectionCallback in the same fit call (the "
                "bounded-domain bounds assume every iterate is projected onto one convex set; two "
                f"projections in a row do not project onto their intersection). Found {len(projections)}."
            )
        if projections[0].diameter > declared:
            raise AccountingError(
                f"diameter must be >= the ProjectionCallback's diameter = {projections[0].diameter:g}. "
                f"Found diameter={declared:g}."
            )
        return projections[0]

    def _fail(self, message: str) -> None:
        self._void(message)
        raise PipelineChangedError(message)

    def _void(self, message: str) -> None:
        self._failure = message
        self._remove_probe()

    def _remove_probe(self) -> None:
        """Unwrap the step (the GLM probe wraps the core probe's train_step wrapper: removed first) and drop
        the train function compiled with the wrappers, so that later training does not run them; the
        probes' records stay readable."""
        if self._glm_probe is not None:
            self._glm_probe.remove()
        if self._probe is not None:
            self._probe.remove()
            self.model.train_function = None

    # -- the checks -------------------------------------------------------------

    def _problem(self) -> str | None:
        """What the steps recorded since the last check, or the host's state, do that the plan does not
        allow (None when nothing); advances the count of checked steps over every step found correct. Once
        training ended every step was checked: later training is what ``_check_usable`` refuses."""
        if self._ended:
            return None
        record = self._probe.read()
        glm = self._glm_probe.read() if self._glm_probe is not None else None
        if record.lost(self._steps):
            return (
                f"the callback must check every step: {record.steps - self._steps} steps ran since its last check, "
                f"more than the {record.capacity} (one epoch) it records between two checks (train_on_batch or "
                "another training call inside fit?)" + _VOID
            )
        if glm is not None and glm.steps != record.steps:
            return f"the GLM checks recorded {glm.steps} steps and the step checks {record.steps}" + _VOID
        for k in range(self._steps + 1, record.steps + 1):
            problem = self._step_problem(k, record.row(k))
            if problem is None and glm is not None:
                problem = self._glm_probe.problem(k, glm.row(k))
            if problem is not None:
                return problem
            self._steps = k
        return self._host_problem()

    def _step_problem(self, k: int, row: Any) -> str | None:
        """What step ``k`` did (its recorded row) that the plan does not allow; the facts of docs/tf_privacy.md."""
        plan, s = self._template, self.optimizer_settings
        started = self._start_iterations + k - 1
        if row[internals.STEP] != k or row[internals.DP_CALLS] != 1 or row[internals.ITERATIONS] != started:
            return (
                f"every optimizer step must be one DP-SGD step of the compiled train_step, observed by this "
                f"callback: step {k} ran {row[internals.DP_CALLS]:g} DP gradient computation(s) and started at "
                f"optimizer.iterations={row[internals.ITERATIONS]:g} (expected 1 and {started}: a train_step that "
                "does not call the DP optimizer once, a second optimizer, or optimizer steps between the "
                "steps)" + _VOID
            )
        b = plan.batch_size
        rows, length = int(row[internals.ROWS]), int(row[internals.LOSS_LENGTH])
        if rows != b:
            return (
                f"every batch must have batch_size = {b} examples, as planned: step {k} had {rows}. Change "
                "nothing in the data between steps" + _VOID
            )
        if length != b:
            return (
                f"the loss must return one value per example: step {k} passed a loss vector of {length} "
                f"entries for a batch of {b} examples to TF Privacy, which clips one gradient per entry "
                f"(num_microbatches=None) and divides by {length}. An example contributing several entries "
                "(augmented views concatenated, pairs, a loss over tokens) contributes several clipped "
                "gradients, which multiplies the sensitivity the bounds assume. Average each example's terms "
                "inside the loss so that it returns a vector of batch_size values" + _VOID
            )
        if row[internals.WEIGHT_OFF_ONE] > 0:
            return (
                f"every example's loss weight must be 1: step {k} fed fit's sample_weight / class_weight with an "
                f"entry {row[internals.WEIGHT_OFF_ONE]:g} away from 1, which rescales that example's loss" + _VOID
            )
        clip, std = row[internals.CLIP], row[internals.NOISE_STD]
        planned_std = s.noise_multiplier * s.l2_norm_clip
        if not (_close(clip, s.l2_norm_clip) and _close(std, planned_std)):
            return (
                f"the clip norm and the noise must stay as planned: step {k} clipped at {clip:g} with noise std "
                f"{std:g} on the clipped sum (noise multiplier {std / clip if clip else math.inf:g}), planned "
                f"C = {s.l2_norm_clip:g}, std = {planned_std:g} (z = {s.noise_multiplier:g}). Something changed "
                "the optimizer's l2_norm_clip or noise_multiplier (a tf.Variable assigned during fit); keep "
                "them fixed, or account the run with the smallest noise multiplier and the largest clip norm "
                "it used" + _VOID
            )
        rate = row[internals.LEARNING_RATE]
        if rate not in (s.learning_rate, float(np.float32(s.learning_rate))):
            return (
                f"learning_rate must stay constant during training (a schedule or callback changed it): step {k} "
                f"used {rate!r} after starting with {s.learning_rate!r}" + _VOID
            )
        if row[internals.TAMPERED]:
            return (
                f"within step {k}, something other than the DP optimizer's update changed the model's weights "
                "(a second, non-private optimizer, a layer updating a non-trainable weight from the batch, e.g. "
                "a running statistic or a counter of the data, or an assign in the step). Every weight change "
                "must be the DP-SGD update; statistics of the private data kept in the model are released with "
                "it without noise" + _VOID
            )
        if row[internals.OTHERS_MOVED]:
            return (
                f"step {k} must start where step {k - 1} ended: the non-trainable weights changed between the two "
                "steps (a callback or other code wrote them). Weights that are not trained must stay as they "
                "were at the start of fit" + _VOID
            )
        if row[internals.MOVED] > self._moved_tolerance:
            projected = " (projected onto the ball)" if self._projection else ""
            return (
                f"step {k} must start where step {k - 1} ended{projected}: "
                f"the weights moved by {row[internals.MOVED]:.3g} between the two steps (a callback or other code "
                "changed them). Only ProjectionCallback may move the weights between steps" + _VOID
            )
        if self._projection is not None:
            radius = self.assumptions.diameter / 2
            if row[internals.START_DISTANCE] > radius:
                return (
                    f"every step must start inside the projection ball of radius {radius:g} (diameter "
                    f"{self.assumptions.diameter:g}): step {k} started at distance {row[internals.START_DISTANCE]:g} "
                    "from its center (code after ProjectionCallback moved the weights out). Put nothing that "
                    "changes the weights after ProjectionCallback" + _VOID
                )
        return None

    def _host_problem(self) -> str | None:
        """Facts of the run kept on the host: the optimizer object, the learning rate it will read, the model's
        variables, and what the DP optimizer differentiated in every trace of the step."""
        model = self.model
        if model.optimizer is not self._optimizer:
            return "model.optimizer must stay the optimizer fit started with: it was replaced during fit" + _VOID
        expected = self.optimizer_settings.learning_rate
        try:
            current = conf.learning_rate(internals.current_learning_rate(self._optimizer))
        except AccountingError as error:
            return f"the learning rate changed during training: {error}" + _VOID
        if current not in (expected, float(np.float32(expected))):  # the variable holds float32(eta)
            return (
                f"learning_rate must stay constant during training (a schedule or callback changed it). "
                f"Found {current!r} after starting with {expected!r}" + _VOID
            )
        current_ids = tuple(id(v) for v in model.trainable_variables)
        traced = [sorted(map(id, dp)) for dp in self._probe.dp_variables]  # per trace of the step
        if current_ids != self._trainable_ids or any(ids != sorted(self._trainable_ids) for ids in traced):
            differentiated = " or ".join(sorted({str(len(ids)) for ids in traced})) or "none"
            return (
                "the DP optimizer must train exactly the model's trainable variables, fixed for the whole run: "
                f"by the end of step {self._steps} model.trainable_variables has {len(current_ids)} variable(s) (at "
                f"the start {len(self._trainable_ids)}) and the DP optimizer differentiated {differentiated}. A "
                "layer's trainable flag changed during fit, or another optimizer trains some variables; train all "
                "parameters with the one DP optimizer" + _VOID
            )
        if tuple(id(v) for v in model.weights) != self._weight_ids:
            return (
                f"the model's weights must be the ones fit started with: after step {self._steps} model.weights "
                f"lists {len(model.weights)} variable(s), at the start {len(self._weight_ids)} (a layer created "
                "or replaced during fit); build the whole model before fit" + _VOID
            )
        return None

    def _check_final_weights(self) -> None:
        """Once training ended: the model must still hold the weights of the last counted step (projected)."""
        moved, others = self._probe.departure()
        if moved > self._moved_tolerance or others:
            self._void(
                "the model's weights must be those of the last counted step: "
                + (f"the trainable weights moved by {moved:.3g}" if moved > self._moved_tolerance else "")
                + (" and " if others and moved > self._moved_tolerance else "")
                + ("a non-trainable weight changed" if others else "")
                + " after fit's last step (an assign, another training run, or a callback's on_train_end). "
                "The epsilon describes the model the counted steps produced, not a model changed afterwards" + _VOID
            )
            raise PipelineChangedError(self._failure)

    def _check_final_in_ball(self) -> None:
        if self._projection is None or self.model is None:
            return
        radius = self.assumptions.diameter / 2
        distance = self._projection.distance_from_center()
        if distance > radius:
            message = (
                f"the final model must lie in the projection ball of radius {radius:g}: it is at distance "
                f"{distance:g} from the center (the weights were changed after the last projection)" + _VOID
            )
            self._failure = message
            raise PipelineChangedError(message)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None:
            return
        self._verify()  # catches a change made before the epoch's first step (a LearningRateScheduler)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None:
            return
        self._verify()
        fit = self.fit_settings
        if self._steps % fit.steps_per_epoch:
            self._fail(
                f"every epoch must be one pass over the data in {fit.steps_per_epoch} steps of "
                f"{fit.batch_size} examples: an epoch ended after {self._steps} steps in total" + _VOID
            )
        if logs is not None and self._steps:
            logs["epsilon"] = self.epsilon

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None:
            return
        self._verify()
        self._remove_probe()
        self._ended = True
        _TRAINED[self.model] = self._steps
        if getattr(self.model, "stop_training", False):
            self._fail(
                "model.stop_training must stay False: a callback set it and stopped "
                f"training after {self._steps} of the {self._template.steps} planned steps. A stopping time "
                "chosen during training from the private data is not covered by the bounds, which assume a "
                "number of steps fixed in advance; the epsilon of this run is void. Choose the number of "
                "epochs before training. Found model.stop_training=True."
            )
        if self._steps != self._template.steps:
            self._fail(f"fit ran {self._steps} steps, planned {self._template.steps}" + _VOID)
        self._check_final_in_ball()


_TOLERANCE = 1e-5  # float32 rounding of the projection, relative to the ball's size


def _center_norm(projection: ProjectionCallback | None) -> float:
    if projection is None:
        return 0.0
    return math.sqrt(sum(float(tf.reduce_sum(tf.square(tf.cast(c, tf.float64)))) for c in projection.center))


def _close(found: float, planned: float) -> bool:
    return abs(found - planned) <= 1e-6 * abs(planned)
