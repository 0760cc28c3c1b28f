r"""Rules that read a metric during training: ``EarlyStopping``, ``ReduceLROnPlateau``, ``TerminateOnNaN``, and
any callback setting ``model.stop_training``. A rule whose metric is computed on the private data makes the run
depend on the data beyond the noisy steps: refused, whether it fires or not (on a neighbouring dataset it can
fire where it did not here). A rule the user declares to read data outside the private set only
(``metric_source="public"``, with ``validation_data`` that is not a ``validation_split``) is a function of the
released iterates: the every-iterate rows cover it (its decisions are post-processing of their release), the
last-iterate rows do not (it reads intermediate iterates), and a stopping rule makes the epsilon cover every
planned step (the stopping time is chosen during the run)."""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

from lastiter_plugins.host import Departure

from .._errors import AccountingError
from .._settings import FitSettings
from ._check import Check, Start, Verdict, weakening

_RULES = (tf.keras.callbacks.EarlyStopping, tf.keras.callbacks.ReduceLROnPlateau, tf.keras.callbacks.TerminateOnNaN)
_DECLARE = (
    "declare metric_source='public' if it reads only data outside the private set (validation_data you may publish)"
)


class MetricRulesCheck(Check):
    gates = weakening(update="any")

    def start(self, start: Start) -> Iterable[Departure]:
        self.public = start.metric_source == "public"
        self.planned = start.config.steps
        self.stopped_at: int | None = None
        rules = []
        for cb in start.fit.callbacks:
            if not isinstance(cb, _RULES):
                continue
            private = _reads_private_data(cb, start.fit)
            if private or not self.public:
                raise AccountingError(_refusal(cb, private))
            rules.append(f"{type(cb).__name__}(monitor={cb.monitor!r})")
            self.planned_steps = self.planned_steps or isinstance(cb, tf.keras.callbacks.EarlyStopping)
        if rules:
            yield Departure(
                step=1,
                fact=f"{', '.join(rules)} reads a public metric of intermediate models (metric_source='public')",
                changes=self.gates,
            )

    def epoch_end(self, steps: int, stopped: bool) -> Verdict:
        return self._stop(steps, stopped)

    def train_end(self, steps: int, stopped: bool) -> Verdict:
        return self._stop(steps, stopped)

    def _stop(self, steps: int, stopped: bool) -> Verdict:
        if not stopped or steps >= self.planned or self.stopped_at is not None:
            return None
        self.stopped_at = steps
        if self.public:
            self.planned_steps = True
            return Departure(
                step=max(steps, 1),
                fact=f"a callback stopped training after {steps} of the {self.planned} planned steps "
                "(metric_source='public')",
                changes=self.gates,
            )
        return (
            "model.stop_training must stay False: a callback set it and stopped "
            f"training after {steps} of the {self.planned} planned steps. A stopping time "
            "chosen during training from the private data is not covered by the bounds, which assume a "
            "number of steps fixed in advance; the epsilon of this run is void. Choose the number of "
            f"epochs before training, or {_DECLARE}. Found model.stop_training=True."
        )


def _reads_private_data(cb: tf.keras.callbacks.Callback, fit: FitSettings) -> str:
    """Why ``cb``'s metric is computed on the private data whatever the user declares (empty when it may not be)."""
    if isinstance(cb, tf.keras.callbacks.TerminateOnNaN):
        return "it reads the training loss, computed on the private batches"
    if isinstance(cb, tf.keras.callbacks.EarlyStopping) and cb.restore_best_weights:
        return "restore_best_weights=True replaces the final model by a selected iterate"
    monitor = str(cb.monitor)
    if not monitor.startswith("val_"):
        return f"it monitors {monitor!r}, a training metric computed on the private batches"
    if fit.validation_split > 0:
        return f"it monitors {monitor!r} on validation_split={fit.validation_split:g}, a part of the private data"
    return ""


def _refusal(cb: tf.keras.callbacks.Callback, private: str) -> str:
    name = type(cb).__name__
    fix = f" ({private})" if private else ""
    if isinstance(cb, tf.keras.callbacks.EarlyStopping):
        if cb.restore_best_weights:
            return (
                "EarlyStopping must not be used with restore_best_weights=True: it replaces the final "
                f"model by the iterate of the epoch with the best {cb.monitor!r}, an iterate selected by "
                "comparing intermediate iterates on (private) data. The last-iterate bounds cover the "
                "final iterate of a fixed number of steps only, not a selected one. Remove EarlyStopping "
                "and choose the number of epochs before training. Found restore_best_weights=True."
            )
        return (
            "EarlyStopping must not be in fit's callbacks: it stops training at an epoch chosen from "
            f"{cb.monitor!r}{fix}, and a stopping time chosen from the private data is not covered by any bound, "
            "which assume a number of steps fixed in advance. Remove EarlyStopping and choose the number of epochs "
            f"before training, or {_DECLARE}. Found EarlyStopping(monitor={cb.monitor!r}, restore_best_weights=False)."
        )
    if isinstance(cb, tf.keras.callbacks.ReduceLROnPlateau):
        return (
            "ReduceLROnPlateau must not be in fit's callbacks, whether it fires or not: it lowers the learning "
            f"rate when {cb.monitor!r}{fix}, a metric of intermediate models, stops improving. On a neighbouring "
            "dataset it can fire where it did not here, so the learning rates of the run depend on the private data, "
            "and no bound covers that (they assume a learning rate fixed in advance). Remove it and choose the "
            f"learning rate before training, or {_DECLARE}. Found ReduceLROnPlateau(monitor={cb.monitor!r})."
        )
    return (
        f"{name} must not be in fit's callbacks: it stops training when the loss on the "
        "private data becomes NaN, a data-dependent stopping time the bounds do not cover (they "
        f"assume a number of steps fixed in advance). Remove it. Found {name}."
    )
