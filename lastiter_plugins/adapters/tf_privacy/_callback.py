r"""``LastIterateCallback``: the valid epsilon of ``model.fit`` with TF Privacy's DP Keras optimizers. A thin
callback: :mod:`._run` holds the run's ledger and asks the checks (:mod:`.checks`) at each of fit's hooks;
:mod:`._report` renders the number beside TF Privacy's own."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

import lastiter_plugins as lp
from lastiter_plugins import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.config import refuse_renamed, resolve_relation
from lastiter_plugins.host import Declaration, Departure, RowLeft
from lastiter_plugins.validation import validate_delta, validate_orders

from . import _glm
from ._errors import AccountingError
from ._observe import check_host, keras_train_steps
from ._report import Report, padding_note
from ._run import Declared, Run
from ._settings import DPOptimizerSettings, FitSettings, flag
from .checks import AllocationCheck, LinearModelCheck

#: Models a LastIterateCallback has trained (their weights carry the earlier run).
_TRAINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class LastIterateCallback(tf.keras.callbacks.Callback):
    r"""The valid epsilon of ``model.fit`` with TF Privacy's DP Keras optimizers, checked at every step.

    Pass it to ``model.fit(x, y, batch_size=b, shuffle=..., callbacks=[...])`` (in-memory arrays) or
    ``model.fit(dataset, callbacks=[...])`` (a ``tf.data`` pipeline whose transformations show the scheme).
    Before the first step it reads the DP optimizer, fit's data and the model, and runs every check
    (:mod:`lastiter_plugins.adapters.tf_privacy.checks`); the compiled step then records one row of facts per
    step, which the checks read at every epoch's end, at the end of training and whenever the epsilon is read.

    A check whose fact breaks a row's precondition removes that row from ``best`` for the rest of the run (Adam
    or momentum, a learning-rate schedule, a constraint, a rule reading a public metric: the last-iterate rows
    leave, the every-iterate ones stay); ``report`` and ``rows_left`` say which rows left, at which step and
    why. A run is refused (``AccountingError`` before the first step, ``PipelineChangedError`` after) only when
    a fact breaks every row, or breaks the bound named, or leaves no last-iterate row under
    ``require="last_iterate"``.

    ``epsilon`` is ``best`` over the rows whose preconditions held at every step: it protects the final model
    only when a last-iterate row wins, every iterate otherwise (``result.protects`` says which), under the
    declared neighbouring relation and sampling. The epoch logs get ``epsilon``, TF Privacy's Poisson number
    (``tf_privacy_epsilon_not_valid``: fit does not sample Poisson batches) and their ratio
    (``epsilon_over_tf_privacy``); ``report`` shows both of TF Privacy's numbers with the reason each is not
    valid.

    Args:
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``).
      published_only: ``best`` over bounds whose proof is a published theorem for this run.
      require: ``"last_iterate"``: refuse, rather than report an every-iterate number, when no last-iterate row
        is left.
      sampling: what fit does: ``reshuffle`` for ``shuffle=True`` (Keras' default) or a tf.data
        ``shuffle(n)`` reshuffled every epoch; ``cyclic`` for ``shuffle=False`` or no shuffle;
        ``shuffle_once`` for a tf.data shuffle kept for every epoch, or arrays permuted once at random, in
        secret, before ``fit(shuffle=False)``.
      dataset_size: n, the number of training examples (checked against fit).
      delta: the target delta.
      smoothness, weak_convexity, strong_convexity, gradient_norms_within_clip, clipped_loss_convex_smooth: the
        loss assumptions (see :class:`lastiter_plugins.LossAssumptions`), for the per-example loss Keras passes
        to the optimizer. ``l2_outside_clip`` is refused: TF Privacy's optimizers add no l2 term outside the clip.
      diameter: D of the projection; requires exactly one :class:`ProjectionCallback` with diameter <= D.
      relation: ``replace_one`` or ``add_or_remove_one``. Default: the sampling scheme's
        (``lastiter_plugins.config.DEFAULT_RELATION``, the rule of every route): ``replace_one`` for the
        schemes Keras runs, the only relation their bounds are proven for.
      orders: Renyi orders (default: the library's grid).
      model: ``"glm"`` derives the loss assumptions of a certified linear model (see docs/tf_privacy.md); the
        assumption arguments must then be left out (``diameter`` stays).
      feature_norm: with ``model="glm"``: A, the bound of the ``FeatureNormClip``.
      metric_source: ``"public"`` declares that every rule reading a metric during training
        (``EarlyStopping``, ``ReduceLROnPlateau``, a callback changing the rate or stopping) reads data outside
        the private set (``validation_data``, not ``validation_split``) or the released iterates only: the
        every-iterate rows then cover the run. None (default): such rules are refused.
      public_statistics: declares that every preprocessing layer of the model fitted by ``adapt``
        (``is_adapted`` true: ``Normalization``, ``Discretization``, ``TextVectorization``, the lookups) was
        adapted on public data only: its statistics are released with the model without noise. False
        (default): such a layer is refused. It does not cover a ``BatchNormalization`` in training mode
        (refused whatever is declared: it couples the examples of each batch).
      public_pretraining: declares that any training of the model before this fit (an earlier ``fit`` in this
        process, or earlier steps of its optimizer) used public data only: its result is the public starting
        point. False (default): such training is refused.

    Raises:
      ValueError: invalid arguments (at construction), ``clipping=`` (renamed).
      UnsupportedHostError: a TF / Keras / TF Privacy version it was not tested with.
      AccountingError: a setting no row covers (before the first step).
      PipelineChangedError: a step no row covers (during training), or steps the callback did not count (when
        reading ``epsilon``).
      NotApplicableError: the named bound (or ``require``) does not apply to the planned run.
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
        require: str | None = None,
        metric_source: str | None = None,
        public_statistics: bool = False,
        public_pretraining: bool = False,
        **renamed: Any,
    ) -> None:
        super().__init__()
        gradient_norms_within_clip = flag(gradient_norms_within_clip)
        clipped_loss_convex_smooth = flag(clipped_loss_convex_smooth)
        refuse_renamed(renamed)
        if renamed:
            raise TypeError(f"LastIterateCallback got an unexpected keyword argument {next(iter(renamed))!r}.")
        check_host()
        sampling = Sampling.parse(sampling)
        if sampling not in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE, Sampling.RANDOM_ALLOCATION):
            raise ValueError(
                "sampling must be cyclic, shuffle_once, reshuffle or random_allocation (with a "
                "RandomAllocationDataset): Keras fit passes over the data in epochs and cannot sample random "
                f"batches or Poisson batches. Found {sampling.value}."
            )
        if flag(l2_outside_clip) is not False:
            raise ValueError(
                "l2_outside_clip must be False under TF Privacy: its DP optimizers add no l2 term to the noisy "
                "clipped mean (Keras' decay and weight decay are refused; an l2 term in the loss is clipped with "
                f"it, and kernel_regularizer fails with a per-example loss). Found l2_outside_clip={l2_outside_clip!r}."
            )
        if metric_source not in (None, "public"):
            raise ValueError(f"metric_source must be None or 'public'. Found {metric_source!r}.")
        public_statistics, public_pretraining = flag(public_statistics), flag(public_pretraining)
        for name, value in (("public_statistics", public_statistics), ("public_pretraining", public_pretraining)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False. Found {value!r}.")
        TrainingConfig(dataset_size=dataset_size, batch_size=1, noise_multiplier=1.0, steps=1, sampling=sampling)
        given = {
            "smoothness": smoothness is not None,
            "weak_convexity": weak_convexity != 0.0,
            "strong_convexity": strong_convexity != 0.0,
            "gradient_norms_within_clip": gradient_norms_within_clip is not False,
            "clipped_loss_convex_smooth": clipped_loss_convex_smooth is not False,
        }
        grid = validate_orders(orders)
        self._declared = Declared(
            declaration=Declaration(
                bound=bound,
                published_only=flag(published_only),
                require=require,  # type: ignore[arg-type]  # Declaration refuses anything but None or LAST_ITERATE
                orders=None if grid is None else tuple(float(a) for a in grid),
            ),
            sampling=sampling,
            dataset_size=int(dataset_size),
            relation=resolve_relation(relation, sampling),
            delta=validate_delta(delta),
            assumptions=LossAssumptions(
                smoothness=smoothness,
                weak_convexity=weak_convexity,
                strong_convexity=strong_convexity,
                diameter=diameter,
                gradient_norms_within_clip=gradient_norms_within_clip,
                clipped_loss_convex_smooth=clipped_loss_convex_smooth,
            ),
            glm=_glm.declare(model=model, feature_norm=feature_norm, declared=given),
            metric_source=metric_source,
            public_statistics=public_statistics,
            public_pretraining=public_pretraining,
        )
        self._run: Run | None = None
        self._keras_steps_before = 0
        self._cache: tuple[tuple[int, int], Any] | None = None

    # -- reading

    @property
    def bound(self) -> str:
        return self._declared.declaration.bound

    @property
    def sampling(self) -> Sampling:
        return self._declared.sampling

    @property
    def delta(self) -> float:
        return self._declared.delta

    @property
    def relation(self) -> Relation:
        return self._declared.relation

    @property
    def published_only(self) -> bool:
        return self._declared.declaration.published_only

    @property
    def assumptions(self) -> LossAssumptions:
        """The loss assumptions (derived before the first step with ``model="glm"``)."""
        return self._declared.assumptions if self._run is None else self._run.assumptions

    @property
    def glm_structure(self) -> _glm.Structure | None:
        """With ``model="glm"``: what the constants were derived from (None before fit)."""
        checks = () if self._run is None else self._run.checks
        return next((c.structure for c in checks if isinstance(c, LinearModelCheck)), None)

    @property
    def optimizer_settings(self) -> DPOptimizerSettings | None:
        """What the DP optimizer was found to do (None before fit)."""
        return None if self._run is None else self._run.settings

    @property
    def fit_settings(self) -> FitSettings | None:
        """What fit was found to do with the data (None before fit)."""
        return None if self._run is None else self._run.fit

    @property
    def steps(self) -> int:
        """Optimizer steps counted and checked so far."""
        return 0 if self._run is None else self._run.count(self.model, self._declared)

    @property
    def departures(self) -> tuple[Departure, ...]:
        """The facts that weakened the pipeline, each from the step it was first seen."""
        return () if self._run is None else tuple(self._run.departures)

    @property
    def config(self) -> TrainingConfig:
        """The TrainingConfig of the pipeline that ran, over the steps the epsilon covers."""
        return self._account().config

    @property
    def rows_left(self) -> tuple[RowLeft, ...]:
        """The rows that applied as declared and left ``best`` during the run (step, fact, precondition)."""
        return self._account().rows_left

    @property
    def result(self) -> lp.EpsilonResult:
        """The labelled guarantee (render it with ``str(result)`` or ``result.to_dict()``)."""
        return self._account().result

    @property
    def epsilon(self) -> float:
        """Epsilon at ``delta`` for the steps counted so far (``best`` over the rows left)."""
        return self.result.epsilon

    @property
    def report(self) -> Report:
        """The valid number, the rows that left ``best``, and what TF Privacy's statement prints for the run."""
        account = self._account()
        orders = self._declared.declaration.orders
        report = Report.of(
            account.result, account.config, account.rows_left, self.departures, account.assumptions, orders
        )
        run = self._usable()
        if run.fit.allocation is None:
            return report
        cut = sum(check.batches_cut for check in run.checks if isinstance(check, AllocationCheck))
        return dataclasses.replace(report, run_notes=(padding_note(run.fit.allocation, cut),))

    def _account(self) -> Any:
        run = self._usable()
        key = (run.accounted_steps, len(run.departures))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, run.account(self._declared))
        return self._cache[1]

    def _usable(self) -> Run:
        """The run, once steps were counted and nothing voids their epsilon."""
        run = self._run
        if run is not None:
            run.verify(self.model, self._declared)
        if run is None or run.steps == 0:
            raise AccountingError("no optimizer step has been counted yet: train with model.fit first.")
        run.when_read(self.model)
        return run

    # -- the Keras hooks

    def set_model(self, model: Any) -> None:
        super().set_model(model)
        # fit builds its callback list (which sets the model) before it resets Keras' count of training steps
        self._keras_steps_before = keras_train_steps(model)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self._run is not None:
            raise AccountingError(
                "a LastIterateCallback accounts one fit call: this one already accounted a run, and a new fit "
                "starts from the model that run trained, which its epsilon alone does not cover. Train in one "
                "fit call, or account the runs together (each run's RDP adds: "
                "lastiter_plugins.adapters.dp_accounting composes them). Found a second on_train_begin."
            )
        self._run = Run.begin(self.model, self._declared, _TRAINED.get(self.model), self._keras_steps_before)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self._run is not None and self._run.failure is None:
            self._run.verify(self.model, self._declared)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._run is None or self._run.failure is not None:
            return
        self._run.epoch_end(self.model, self._declared)
        if logs is not None and self._run.steps:
            logs.update(self.report.logs())

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._run is None or self._run.failure is not None:
            return
        _TRAINED[self.model] = self._run.steps
        self._run.train_end(self.model, self._declared)
