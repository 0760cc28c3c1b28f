r"""Certified linear models under TF Privacy: ``LastIterateCallback(..., model="glm", feature_norm=A)``.

The callback derives the loss assumptions with
:func:`lastiter_plugins.glm.certify_linear_model` from the Keras model and its
compiled loss instead of taking them, and checks inside every compiled step that
the run is the model they were derived for.

Before the first step: the model's trainable variables are those of one
``Dense`` layer without activation or regulariser, fed by a
:class:`FeatureNormClip` of bound <= A, whose output is the model's output
(``Activation("linear")`` layers after it are the identity); the loss given to
``compile`` is ``BinaryCrossentropy(from_logits=True)`` (one output),
``SparseCategoricalCrossentropy(from_logits=True)`` (k >= 2 outputs) or
``Huber(delta)`` (one output), each with ``reduction=NONE`` as TF Privacy needs,
without ``loss_weights`` (the callback's common checks refuse them, and a custom
``train_step`` or ``compute_loss``, for every model).
There is no l2 term: TF Privacy differentiates the per-example loss, so an l2
term in it is clipped with the data term (inside the clip), which is certified
only when clipping is provably inactive on a bounded domain, and Keras'
``kernel_regularizer`` cannot be combined with a per-example loss (Keras 2.14
adds the scalar penalty to the loss vector with ``tf.add_n`` and fails).

In every step (recorded by the compiled step, one row per step, checked with
the callback's other per-step facts): the Dense layer ran once, on the clip's
output (or Keras' cast of it to the Dense layer's dtype), every feature vector
it saw has l2 norm <= A (float64, never accepting a violation), its output went
unchanged into the compiled loss, the loss ran once, the DP optimizer
differentiated exactly the loss' per-example values (no loss weight, scaled or
added term), and the labels it saw are in the range the constants assume
(binary labels in [0, 1] when clipping is certified never active; class ids in
[0, k - 1]).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import tensorflow as tf

import lastiter_plugins as lp
from lastiter_plugins import feature_clip
from lastiter_plugins.glm import LossFamily, certify_linear_model

from . import _observe as observe
from ._errors import AccountingError

#: What the user would declare by hand instead (appended to refusals).
BY_HAND = (
    "Otherwise leave model='glm' out and declare smoothness, strong_convexity, weak_convexity and "
    "gradient_norms_within_clip by hand, valid for every per-example loss on the whole parameter domain."
)
_NONE = tf.keras.losses.Reduction.NONE


@tf.keras.utils.register_keras_serializable(package="lastiter_plugins")
class FeatureNormClip(tf.keras.layers.Layer):
    r"""a -> a min(1, A'/\|a\|) along the last axis: every output row has l2 norm <= A exactly.

    A' = :func:`clip_radius` (A, d, dtype), slightly below A so that float rounding of the clip itself
    cannot push a norm above A (docs/derivations/glm.md#glm-feature-clipping; Higham 2002, Lemma 3.1), nor, in float64,
    the cast of its output to float32 that Keras applies when a float32 layer follows it. Computed in the
    layer's dtype (float32 or float64), one rounding per operation. Put it right before the final
    ``Dense`` of a model accounted with ``model="glm"``.

    Args:
      feature_norm_bound: A > 0.
    """

    def __init__(self, feature_norm_bound: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        feature_clip.safe_clip_radius(feature_norm_bound, 1, np.float64)  # validates A
        self._bound = float(feature_norm_bound)

    @property
    def feature_norm_bound(self) -> float:
        return self._bound

    def call(self, inputs: Any) -> Any:
        dtype = inputs.dtype
        if dtype not in (tf.float32, tf.float64):
            raise ValueError(f"FeatureNormClip needs float32 or float64 features. Found {dtype.name}.")
        dim = int(inputs.shape[-1])
        radius = clip_radius(self._bound, dim, dtype)
        norms = tf.sqrt(tf.reduce_sum(inputs * inputs, axis=-1, keepdims=True))
        factor = tf.minimum(
            tf.ones_like(norms), tf.math.divide(tf.fill(tf.shape(norms), tf.cast(radius, dtype)), norms)
        )
        return inputs * factor

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "feature_norm_bound": self._bound}


def clip_radius(feature_norm_bound: float, dim: int, dtype: Any) -> float:
    r"""A' for :class:`FeatureNormClip` computing in ``dtype``.

    float32: :func:`lastiter_plugins.feature_clip.safe_clip_radius` (A, d, float32). float64: the float64
    radius divided by 1 + 2^-23 (rounded down), so that the clip's output still has norm <= A after Keras
    casts it to float32 for a float32 layer. The cast rounds each entry to nearest, a relative error of at
    most u = 2^-24, or an absolute one of at most 2^-150 in float32's subnormal range, so the norm grows
    to at most \|out\| (1 + u) + sqrt(d) 2^-150 <= A (1 + u) / (1 + 2u) + sqrt(d) 2^-150 <= A, since
    A (1 - (1 + u) / (1 + 2u)) >= A 2^-25 >= 2^-75 (A >= ``feature_clip.MIN_FEATURE_NORM_BOUND`` = 2^-50)
    exceeds sqrt(d) 2^-150 for every d < 2^150. A float64 consumer gets a clip smaller by 1.2e-7 relative.
    """
    if dtype == tf.float32:
        return feature_clip.safe_clip_radius(feature_norm_bound, dim, np.float32)
    radius = np.float64(feature_clip.safe_clip_radius(feature_norm_bound, dim, np.float64)) / (1.0 + 2.0**-23)
    return float(np.nextafter(radius, 0.0))


@dataclasses.dataclass(frozen=True)
class GlmDeclaration:
    """What ``LastIterateCallback(model="glm", ...)`` declares: the feature-norm bound A."""

    feature_norm: float


def declare(*, model: Any, feature_norm: Any, declared: dict[str, Any]) -> GlmDeclaration | None:
    """Validate ``model=`` and ``feature_norm=`` of the callback (None when model is None)."""
    if model is None:
        if feature_norm is not None:
            raise ValueError(f"feature_norm needs model='glm'. Found feature_norm={feature_norm!r} without it.")
        return None
    if model != "glm":
        raise ValueError(f"model must be None or 'glm' (a certified linear model). Found {model!r}.")
    clash = [name for name, given in declared.items() if given]
    if clash:
        raise ValueError(
            f"{', '.join(clash)} must not be given with model='glm': the callback derives the loss assumptions from "
            "the model, its compiled loss and feature_norm. Remove them, or leave model='glm' out to declare them by "
            f"hand. Found {', '.join(clash)}."
        )
    try:
        feature_clip.safe_clip_radius(feature_norm, 1, np.float64)
    except ValueError as exc:
        raise ValueError(str(exc).replace("feature_norm_bound", "feature_norm")) from None
    return GlmDeclaration(float(feature_norm))


# ---------------------------------------------------------------- the model and its loss


@dataclasses.dataclass(frozen=True)
class Structure:
    """What the derivation found: the layers, the loss family and the constants."""

    dense: Any
    clip: Any
    loss: Any
    family: LossFamily
    num_outputs: int
    certificate: Any
    feature_norm: float


def _loss_family(loss: Any, units: int) -> tuple[LossFamily, float | None]:
    expected = (
        "tf.keras.losses.BinaryCrossentropy(from_logits=True) with one output, "
        "SparseCategoricalCrossentropy(from_logits=True) with k >= 2 outputs, or Huber(delta) with one output, "
        "each with reduction=tf.keras.losses.Reduction.NONE (TF Privacy clips one loss per example)"
    )
    kinds = {
        tf.keras.losses.BinaryCrossentropy: LossFamily.BINARY_LOGISTIC,
        tf.keras.losses.SparseCategoricalCrossentropy: LossFamily.SOFTMAX_CROSS_ENTROPY,
        tf.keras.losses.Huber: LossFamily.HUBER,
    }
    family = kinds.get(type(loss))
    if family is None:
        raise AccountingError(
            f"model='glm' reads the loss from model.compile and certifies {expected}. Found "
            f"{type(loss).__name__ if not isinstance(loss, str) else repr(loss)} (a loss string builds a loss "
            "with the default reduction; a custom loss, e.g. one with an l2 term, is not certified). " + BY_HAND
        )
    if loss.reduction != _NONE:
        raise AccountingError(
            f"the loss must have reduction=tf.keras.losses.Reduction.NONE: TF Privacy needs one loss per example. "
            f"Found reduction={loss.reduction!r}."
        )
    options = getattr(loss, "_fn_kwargs", {})
    delta = None
    if family is LossFamily.HUBER:
        delta = float(options.get("delta", 1.0))
    elif not options.get("from_logits", False):
        raise AccountingError(
            f"the loss must be computed from logits ({type(loss).__name__}(from_logits=True)) on the Dense layer's "
            "output: on probabilities Keras clips them to [1e-7, 1 - 1e-7], and the loss is then not convex in the "
            "score. Found from_logits=False. " + BY_HAND
        )
    if family is LossFamily.SOFTMAX_CROSS_ENTROPY:
        if options.get("ignore_class") is not None:
            raise AccountingError(
                "SparseCategoricalCrossentropy must have ignore_class=None: an ignored example has loss 0, "
                f"another loss. Found ignore_class={options.get('ignore_class')!r}."
            )
        if units < 2:
            raise AccountingError(f"SparseCategoricalCrossentropy needs a Dense layer with >= 2 units. Found {units}.")
    elif units != 1:
        raise AccountingError(
            f"{type(loss).__name__} is a scalar GLM here only with one output: the Dense layer must have units=1. "
            f"Found units={units} (Keras averages the loss over the outputs: several GLMs, not one; for classes "
            "use SparseCategoricalCrossentropy(from_logits=True))."
        )
    if family is LossFamily.BINARY_LOGISTIC and int(options.get("axis", -1)) != -1:
        raise AccountingError(f"BinaryCrossentropy must reduce over axis=-1. Found axis={options.get('axis')!r}.")
    return family, delta


def _structure_of(model: Any) -> tuple[Any, Any]:
    variables = {id(v) for v in model.trainable_variables}
    denses = [
        layer
        for layer in model.submodules
        if isinstance(layer, tf.keras.layers.Layer)
        and {id(v) for v in layer.trainable_weights} == variables
        and type(layer) is tf.keras.layers.Dense
    ]
    if len(denses) != 1:
        owners = sorted(
            {
                f"{layer.name} ({type(layer).__name__})"
                for layer in model.submodules
                if isinstance(layer, tf.keras.layers.Layer)
                and not isinstance(layer, tf.keras.Model)
                and any(id(v) in variables for v in layer._trainable_weights)
            }
        )
        raise AccountingError(
            "model='glm' certifies a model whose only trainable layer is one tf.keras.layers.Dense on clipped "
            "features (layers before it frozen: trainable=False), since only then is each per-example loss "
            f"phi(<a, x>) of the trained weights x. Found trainable variables in {', '.join(owners) or 'no layer'}. "
            + BY_HAND
        )
    dense = denses[0]
    if dense.activation is not tf.keras.activations.linear:
        raise AccountingError(
            "the Dense layer must have no activation (activation=None): the loss is computed from its output, the "
            f"score. Found activation={getattr(dense.activation, '__name__', dense.activation)!r}; use a "
            "from_logits=True loss instead. " + BY_HAND
        )
    regularisers = {
        name: getattr(dense, name)
        for name in ("kernel_regularizer", "bias_regularizer", "activity_regularizer")
        if getattr(dense, name) is not None
    }
    if regularisers or model.losses:
        found = ", ".join(regularisers) if regularisers else f"{len(model.losses)} add_loss term(s)"
        raise AccountingError(
            "the model must have no regulariser: Keras 2.14 cannot add a scalar penalty to TF Privacy's per-example "
            "loss vector, and an l2 term written into the per-example loss is clipped with the data term (inside "
            "the clip), so the clipped update is not a scalar GLM step and is certified only when clipping is "
            "provably never active on a bounded domain. Train without the l2 term, or write it into the loss, "
            "project with ProjectionCallback and declare the constants by hand (lastiter_plugins.glm."
            "certify_linear_model(..., l2_placement='inside_clip', projection_radius=R) computes them). "
            f"Found {found}."
        )
    if "call" in vars(dense) or dense.compute_dtype not in ("float32", "float64"):
        raise AccountingError(
            "the Dense layer must run Keras' own call in float32 or float64. Found "
            f"{'a replaced call' if 'call' in vars(dense) else dense.compute_dtype}."
        )
    clips = [layer for layer in model.submodules if isinstance(layer, FeatureNormClip)]
    if not clips:
        raise AccountingError(
            "model='glm' needs a lastiter_plugins.adapters.tf_privacy.FeatureNormClip(A) right before the Dense "
            "layer: it makes every feature vector's norm <= A for every possible example (the neighbouring one "
            "included), which the constants rest on. Found none in the model. " + BY_HAND
        )
    if isinstance(model, tf.keras.Sequential):
        layers = list(model.layers)
        while layers and layers[-1] is not dense and _is_identity(layers[-1]):
            layers.pop()  # Activation("linear") returns its input: the score stays the Dense output
        if layers[-1] is not dense:
            after = layers[-1]
            kind = type(after).__name__
            if isinstance(after, tf.keras.layers.Activation):
                kind += f" {getattr(after.activation, '__name__', after.activation)}"
            raise AccountingError(
                "the Dense layer must be the model's last layer, or be followed only by Activation('linear') "
                f"layers (its output is the score the loss is computed from). Found {after.name} ({kind}) after "
                "it. " + BY_HAND
            )
        position = layers.index(dense)
        if position < 1 or not isinstance(layers[position - 1], FeatureNormClip):
            before = f"{layers[position - 1].name} ({type(layers[position - 1]).__name__})" if position else "nothing"
            raise AccountingError(
                "the layer right before the Dense layer must be FeatureNormClip(A): anything between them can make "
                f"a feature norm exceed A. Found {before}. " + BY_HAND
            )
        clip = layers[position - 1]
    elif len(clips) == 1:
        clip = clips[0]  # the order is checked in every step (the Dense input is the clip's output)
    else:
        raise AccountingError(f"model='glm' needs exactly one FeatureNormClip in the model. Found {len(clips)}.")
    if type(clip) is not FeatureNormClip or "call" in vars(clip):
        raise AccountingError("the feature clip must be FeatureNormClip itself, with its own call.")
    return dense, clip


def _is_identity(layer: Any) -> bool:
    return type(layer) is tf.keras.layers.Activation and layer.activation is tf.keras.activations.linear


def derive(
    decl: GlmDeclaration, model: Any, *, clip_norm: float, diameter: float | None
) -> tuple[lp.LossAssumptions, Structure]:
    """Derive the loss assumptions of ``model`` compiled for TF Privacy, or refuse (AccountingError)."""
    dense, clip = _structure_of(model)
    if clip.feature_norm_bound > decl.feature_norm:
        raise AccountingError(
            f"the FeatureNormClip's bound must be <= feature_norm = {decl.feature_norm:g}. Found "
            f"FeatureNormClip({clip.feature_norm_bound:g}); pass feature_norm={clip.feature_norm_bound:g}."
        )
    units = int(dense.units)
    assumptions, family, certificate = certify(
        decl, loss=model.loss, units=units, bias=bool(dense.use_bias), clip_norm=clip_norm, diameter=diameter
    )
    return assumptions, Structure(dense, clip, model.loss, family, units, certificate, decl.feature_norm)


def certify(
    decl: GlmDeclaration, *, loss: Any, units: int, bias: bool, clip_norm: float, diameter: float | None
) -> tuple[lp.LossAssumptions, LossFamily, Any]:
    """The loss assumptions of a Dense(units, use_bias=bias) layer on features clipped to ``decl.feature_norm``,
    trained on the Keras ``loss`` with clip norm ``clip_norm`` (the callback's and the statement's one path).

    Raises:
      AccountingError: a loss or setting that is not certified.
    """
    family, delta = _loss_family(loss, units)
    certificate = certify_linear_model(
        family,
        feature_norm_bound=decl.feature_norm,
        clip_norm=clip_norm,
        bias=bias,
        num_classes=units if family is LossFamily.SOFTMAX_CROSS_ENTROPY else None,
        projection_radius=None if diameter is None else diameter / 2.0,
        huber_delta=delta,
    )
    if not certificate.certified:
        raise AccountingError(certificate.not_certified)
    return lp.LossAssumptions(**certificate.loss_assumption_kwargs()), family, certificate


def clip_as_run(l2_norm_clip: float) -> float:
    """The clip norm the compiled step uses for the constants: C or its float32 rounding, the smaller."""
    return min(l2_norm_clip, float(np.float32(l2_norm_clip)))


# ---------------------------------------------------------------- the per-step record

# Slots of a step's row (one StepTable, written by the compiled step).
TRAIN_STEPS, CLIP_CALLS, DENSE_CALLS, FED_BY_CLIP, LINEAR, NORM_BAD, MAX_NORM = range(7)
LOSS_CALLS, OUTPUT_IS_SCORE, LABEL_MIN, LABEL_MAX, LOSS_DIFFERS = range(7, 12)
_SLOTS = 12
_MISSING = object()


class Probe:
    """Instance-level wrappers of ``train_step``, the clip's and the Dense layer's ``call``, the loss' ``call``
    and the DP optimizer's ``_compute_gradients`` (removed by :meth:`remove`) that record, inside the compiled
    training step, one row per step of what the GLM constants rest on. Only calls traced inside
    ``train_step`` record (evaluation does not)."""

    def __init__(self, model: Any, structure: Structure, capacity: int) -> None:
        self.structure = structure
        initial = np.zeros(_SLOTS)
        initial[LABEL_MIN], initial[LABEL_MAX] = np.inf, -np.inf
        self.record = observe.StepTable(_SLOTS, capacity, "lastiter_glm_steps", initial)
        self._tracing_train = False
        self._clip_out: Any = None
        self._score: Any = None
        self._loss_values: Any = None
        self._saved: list[tuple[Any, str, Any]] = []
        self._wrap(model, "train_step", self._train_step)
        self._wrap(structure.clip, "call", self._clip_call)
        self._wrap(structure.dense, "call", self._dense_call)
        self._wrap(structure.loss, "call", self._loss_call)
        self._wrap(model.optimizer, "_compute_gradients", self._compute_gradients)

    def _wrap(self, obj: Any, name: str, make: Any) -> None:
        self._saved.append((obj, name, obj.__dict__.get(name, _MISSING)))
        object.__setattr__(obj, name, make(getattr(obj, name)))

    def remove(self) -> None:
        for obj, name, before in reversed(self._saved):
            if before is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                object.__setattr__(obj, name, before)
        self._saved = []

    def read(self) -> observe.StepRecord:
        return self.record.read()

    def _train_step(self, original: Any) -> Any:
        record = self.record

        def train_step(data: Any) -> Any:
            self._tracing_train, self._clip_out, self._score, self._loss_values = True, None, None, None
            try:
                record.begin()
                record.add(TRAIN_STEPS, 1.0)
                outputs = original(data)
                record.end()
                return outputs
            finally:
                self._tracing_train = False

        return train_step

    def _clip_call(self, original: Any) -> Any:
        def call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(inputs, *args, **kwargs)
            if self._tracing_train:
                self.record.add(CLIP_CALLS, 1.0)
                self._clip_out = out
            return out

        return call

    def _dense_call(self, original: Any) -> Any:
        dense, record = self.structure.dense, self.record

        def call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(inputs, *args, **kwargs)
            if self._tracing_train:
                record.add(DENSE_CALLS, 1.0)
                record.add(FED_BY_CLIP, 1.0 if _fed_by(inputs, self._clip_out) else 0.0)
                record.add(LINEAR, 1.0 if dense.activation is tf.keras.activations.linear else 0.0)
                wide = tf.cast(inputs, tf.float64)  # what the Dense layer computes with (after Keras' cast)
                norms = tf.sqrt(tf.reduce_sum(wide * wide, axis=-1))
                d = int(inputs.shape[-1])
                ok = tf.logical_and(
                    norms * (1.0 + (d + 4) * 2.0**-53) <= self.structure.feature_norm, tf.math.is_finite(norms)
                )
                record.add(NORM_BAD, tf.reduce_sum(tf.cast(tf.logical_not(ok), tf.float64)))
                record.maximum(
                    MAX_NORM, tf.reduce_max(tf.where(tf.math.is_finite(norms), norms, tf.constant(np.inf, tf.float64)))
                )
                self._score = out
            return out

        return call

    def _loss_call(self, original: Any) -> Any:
        record = self.record

        def call(y_true: Any, y_pred: Any) -> Any:
            values = original(y_true, y_pred)
            if self._tracing_train:
                record.add(LOSS_CALLS, 1.0)
                record.add(OUTPUT_IS_SCORE, 1.0 if y_pred is self._score else 0.0)
                labels = tf.cast(y_true, tf.float64)
                record.minimum(LABEL_MIN, tf.reduce_min(labels))
                record.maximum(LABEL_MAX, tf.reduce_max(labels))
                self._loss_values = values
            return values

        return call

    def _compute_gradients(self, original: Any) -> Any:
        def compute_gradients(loss, var_list, grad_loss=None, tape=None):
            if self._tracing_train:
                self.record.add(LOSS_DIFFERS, _differ(loss, self._loss_values))
            return original(loss, var_list, grad_loss=grad_loss, tape=tape)

        return compute_gradients

    def problem(self, k: int, row: np.ndarray) -> str | None:
        """Why step ``k`` (its recorded row) is not the certified GLM step (None when it is)."""
        counts = (TRAIN_STEPS, CLIP_CALLS, DENSE_CALLS, LOSS_CALLS)
        if any(row[slot] != 1 for slot in counts):
            return _at(
                k,
                f"each step must run the FeatureNormClip, the Dense layer and the compiled loss once, inside the "
                f"compiled train_step: step {k} ran {row[CLIP_CALLS]:g} clip, {row[DENSE_CALLS]:g} Dense and "
                f"{row[LOSS_CALLS]:g} loss call(s) (a layer removed or bypassed, or a train function traced before "
                "the callback was attached)",
            )
        if row[FED_BY_CLIP] != 1:
            return _at(
                k,
                "the Dense layer's input must be the FeatureNormClip's output in every step (or its cast to the "
                "Dense layer's dtype): the constants rest on every feature norm being <= A. Found a step whose Dense "
                "input did not come from the clip",
            )
        if row[LINEAR] != 1:
            return _at(
                k, "the Dense layer must keep activation=None for the whole run. Found an activation set during fit"
            )
        if row[NORM_BAD] > 0:
            return _at(
                k,
                f"every feature vector entering the Dense layer must have l2 norm <= feature_norm = "
                f"{self.structure.feature_norm:g}. Found {row[NORM_BAD]:g} that did not (largest norm "
                f"{row[MAX_NORM]:.17g}; non-finite features count as violations)",
            )
        if row[OUTPUT_IS_SCORE] != 1:
            return _at(
                k,
                "the compiled loss must receive the Dense layer's output unchanged (the score): an operation "
                "between them changes the loss. Found another tensor",
            )
        if row[LOSS_DIFFERS]:
            return _at(
                k,
                f"the DP optimizer must differentiate the certified loss itself, one unscaled "
                f"{type(self.structure.loss).__name__} value per example: the loss vector it received differs from "
                "the loss' values (loss weights, a scaled or added term), which changes the smoothness behind the "
                "constants",
            )
        family, low, high = self.structure.family, row[LABEL_MIN], row[LABEL_MAX]
        cert = self.structure.certificate
        if family is LossFamily.BINARY_LOGISTIC and not cert.clipping_can_be_active and not (low >= 0 and high <= 1):
            return _at(
                k,
                "binary labels must be in [0, 1]: clipping was certified never active from |dloss/du| = "
                f"|sigmoid(u) - y| <= 1, which needs them. Found labels in [{low:g}, {high:g}]",
            )
        if family is LossFamily.SOFTMAX_CROSS_ENTROPY and not (
            low >= 0 and high <= self.structure.num_outputs - 1 and math.isfinite(high)
        ):
            return _at(
                k, f"class labels must be in [0, {self.structure.num_outputs - 1}]. Found labels in [{low:g}, {high:g}]"
            )
        return None


def _at(k: int, problem: str) -> str:
    return f"{problem} (step {k})"


def _fed_by(inputs: Any, clip_out: Any) -> bool:
    """Whether the Dense layer's input is the clip's output, or Keras' cast of it to the layer's dtype."""
    if clip_out is None:
        return False
    if inputs is clip_out:
        return True
    op = getattr(inputs, "op", None)
    return op is not None and op.type == "Cast" and len(op.inputs) == 1 and op.inputs[0] is clip_out


def _differ(loss: Any, values: Any) -> Any:
    """1.0 when the loss vector the DP optimizer received is not exactly the certified loss' values, in graph."""
    if values is None or callable(loss):
        return tf.constant(1.0, tf.float64)
    # Compared in float32: Keras' Loss.__call__ computes the (unweighted) per-example loss in float32
    # (losses_utils.compute_weighted_loss), which rounds a float64 loss without changing its gradient.
    a = tf.reshape(tf.cast(loss, tf.float32), [-1])
    b = tf.reshape(tf.cast(values, tf.float32), [-1])
    same = tf.cond(
        tf.equal(tf.size(a), tf.size(b)),
        lambda: tf.reduce_all(tf.equal(a, tf.reshape(b, tf.shape(a)))),
        lambda: tf.constant(False),
    )
    return 1.0 - tf.cast(same, tf.float64)
