r"""Certified linear models under Opacus: ``register(..., model="glm", loss=..., feature_norm=A)``.

Instead of asking for the loss assumptions, the accountant derives them with
:func:`lastiter_plugins.glm.certify_linear_model` from the model it is attached to
(at ``make_private``) and checks at every step that the run still is the model
they were derived for:

* at ``make_private``: the only trainable layer is a final ``torch.nn.Linear``
  (frozen layers before it are fine: the features are then a fixed function of
  the example, as long as no buffer changes, which the base accountant checks at
  every step), its input is the output of a :class:`FeatureNormClip` of bound
  <= A and nothing follows it; the optimizer is plain SGD, whose ``weight_decay``
  is folded into the constants (under Opacus it is applied after the noisy
  clipped mean: outside the clip); the clip norm makes clipping never active
  where the loss is not a scalar GLM (softmax); the loss module given as
  ``make_private(criterion=...)`` is the declared loss exactly (class and every
  parameter that changes its curvature or scale: :func:`check_loss_module`);
* in every training forward: the features entering the Linear are the clip's
  output, the Linear runs once and its output is the model's output, on which the
  loss module is called once (its input and target recorded);
* at every step, inside the accountant's sequence (one more check, not a wrapper):
  the clipping norm, the feature clip's bound and the loss module are the ones the
  constants were derived for (the weight decay per group and the trained parameters
  are the accountant's optimizer checks, against the derived values); every feature
  row since the last step has l2 norm <= A (never accepting a violation: a rounding
  bound in the features' dtype, else float64); the per-example gradients Opacus clips have
  the structure of the declared GLM (rank one, backprop outer feature, checked on a
  sample of the batch), and each example's gradient with respect to its score is
  the declared loss' gradient at its score and label (logistic: sigmoid(u) - y with
  y in [0, 1]; softmax: softmax(u) - onehot(y); Huber: clamp(u - y, -delta, delta)).

The derivations are in :mod:`lastiter_plugins.glm` (Song, Steinke, Thakkar &
Thakurta 2021 for clipped GLMs; Ye & Shokri 2022, arXiv 2203.05363, for the
contraction with an l2 term).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref
from typing import Any, NoReturn

import numpy as np
import torch
from torch import nn

import lastiter_plugins as lp
from lastiter_plugins import feature_clip
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._loaders import check_data_loader
from lastiter_plugins.adapters.opacus._observe import (
    core_batch,
    immutable_key,
    optimizer_normaliser,
    planned_normaliser,
    poisson_batch_size,
    unwrap,
)
from lastiter_plugins.adapters.opacus._registration import (
    LastIterateConfigurationError,
    LastIteratePipelineChangedError,
    Registration,
)
from lastiter_plugins.glm import LinearModelCertificate, LossFamily, certify_linear_model

_Error = LastIterateConfigurationError
_Changed = LastIteratePipelineChangedError

#: Loss names accepted by ``register(model="glm", loss=...)`` and the torch loss each stands for.
LOSSES: dict[str, tuple[LossFamily, str]] = {
    "logistic": (LossFamily.BINARY_LOGISTIC, "torch.nn.BCEWithLogitsLoss, labels in [0, 1], one output"),
    "softmax": (LossFamily.SOFTMAX_CROSS_ENTROPY, "torch.nn.CrossEntropyLoss on the logits, k >= 2 outputs"),
    "huber": (LossFamily.HUBER, "torch.nn.HuberLoss(delta=huber_delta), one output"),
}
#: The torch loss module of each declared loss, and its parameters that change the loss' curvature
#: or scale, with the value the derived constants assume (None: huber_delta).
LOSS_MODULES: dict[str, tuple[type, dict[str, Any]]] = {
    "logistic": (nn.BCEWithLogitsLoss, {"weight": None, "pos_weight": None}),
    "softmax": (nn.CrossEntropyLoss, {"weight": None, "label_smoothing": 0.0}),
    "huber": (nn.HuberLoss, {"delta": None}),
}
_ALIASES = {
    "binary_logistic": "logistic",
    "softmax_cross_entropy": "softmax",
    "cross_entropy": "softmax",
}
#: What the user would declare by hand instead (appended to every refusal of the GLM route).
BY_HAND = (
    "Otherwise register without model='glm' and declare smoothness, strong_convexity, weak_convexity and "
    "gradient_norms_within_clip by hand, valid for every per-example loss on the whole parameter domain."
)
#: Relative tolerance of the per-step structure checks (float32 arithmetic of Opacus' grad samplers).
_TOLERANCE = 1e-4
#: Training forwards whose features wait for the step's norm check (more are checked at once).
_UNCHECKED_MAX = 8


# ---------------------------------------------------------------- the feature clip


class FeatureNormClip(nn.Module):
    r"""a -> a min(1, A'/\|a\|) along the last axis, so that every output row has l2 norm <= A exactly.

    A' = :func:`lastiter_plugins.feature_clip.safe_clip_radius` (A, d, dtype) is
    slightly below A so that float rounding of the clip itself cannot push a norm
    above A (docs/derivations/glm.md#glm-feature-clipping; Higham 2002, Lemma 3.1). Computed in
    the input's dtype (float32 or float64) with one rounding per operation. Put it
    right before the final ``nn.Linear`` of a model registered with ``model="glm"``:
    then \|a\| <= A holds for every possible example, the neighbouring one included.

    Args:
      feature_norm_bound: A > 0.
    """

    def __init__(self, feature_norm_bound: float) -> None:
        super().__init__()
        feature_clip.safe_clip_radius(feature_norm_bound, 1, np.float64)  # validates A
        self._bound = float(feature_norm_bound)
        self._radii: dict[tuple[int, torch.dtype], float] = {}

    @property
    def feature_norm_bound(self) -> float:
        """A: every output row has l2 norm <= A."""
        return self._bound

    def extra_repr(self) -> str:
        return f"feature_norm_bound={self._bound:g}"

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        dtype = features.dtype
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"FeatureNormClip needs float32 or float64 features. Found {dtype}.")
        dim = int(features.shape[-1])
        key = (dim, dtype)
        radius = self._radii.get(key)
        if radius is None:
            np_dtype = np.float32 if dtype is torch.float32 else np.float64
            radius = self._radii[key] = feature_clip.safe_clip_radius(self._bound, dim, np_dtype)
        norms = torch.sqrt(torch.sum(features * features, dim=-1, keepdim=True))
        # tensor / tensor: one correctly rounded division (a Python float / tensor is reciprocal-then-multiply)
        factor = torch.clamp(torch.div(torch.full_like(norms, radius), norms), max=1.0)
        return features * factor


def feature_norms_ok(features: torch.Tensor, bound: float) -> tuple[bool, float]:
    """(every row has exact l2 norm <= bound, the largest norm found), in float64 on the features' device.

    float32 -> float64 is exact and so are the squares; the float64 sum and root are within
    (d + 4) 2^-53 relative of the exact norm, so a row is accepted only if its exact norm is <= bound
    (as :func:`lastiter_plugins.feature_clip.feature_norms_within`)."""
    wide = features.detach().to(torch.float64)
    norms = torch.sqrt(torch.sum(wide * wide, dim=-1))
    largest = float(norms.max()) if norms.numel() else 0.0
    d = int(features.shape[-1])
    ok = math.isfinite(largest) and largest * (1.0 + (d + 4) * 2.0**-53) <= bound
    return ok, largest


def _largest_square(features: list) -> torch.Tensor | None:
    """The largest row sum of squares of the tensors in ``features``, computed in their dtype (0-dim; NaN
    propagates), None when they hold no row. An upper bound on the exact value is :func:`_square_bound`."""
    squares = [torch.linalg.vecdot(f, f) for f in features if f.numel()]
    if not squares:
        return None
    return (squares[0] if len(squares) == 1 else torch.cat([q.reshape(-1) for q in squares])).max()


def _square_bound(computed: float, features: list) -> float:
    """An upper bound on the exact largest row sum of squares, from its value computed in the features' dtype.

    Any order of evaluation of a sum of d products in a dtype of unit roundoff u (each operation rounded
    once, fused or not) is within gamma_d = d u / (1 - d u) of the exact sum, relative (Higham 2002,
    Lemma 3.1 and section 3.1); d 2^-126 (resp. 2^-1022) more covers squares and partial sums flushed to
    zero; the few float64 operations here are covered by 16 float64 ulps."""
    d = max(int(f.shape[-1]) for f in features)
    u = max(torch.finfo(f.dtype).eps for f in features) / 2.0
    tiny = max(torch.finfo(f.dtype).tiny for f in features)
    if not math.isfinite(computed) or computed < 0 or d * u >= 0.5:
        return math.inf
    return (computed + d * tiny) / (1.0 - d * u / (1.0 - d * u)) * (1.0 + 16 * 2.0**-53)


def _rows(tensor: torch.Tensor, dtype: torch.dtype, rows: int) -> torch.Tensor:
    """``tensor`` as a (rows, -1) matrix of ``dtype`` (itself when it already is one: no torch call)."""
    if tensor.dtype is dtype and tensor.dim() == 2 and tensor.shape[0] == rows:
        return tensor
    return tensor.to(dtype).reshape(rows, -1)


# ---------------------------------------------------------------- the declaration


@dataclasses.dataclass(frozen=True)
class GlmDeclaration:
    """What ``register(model="glm", ...)`` declares: the loss and the feature-norm bound A."""

    loss: str  # a key of LOSSES
    feature_norm: float
    huber_delta: float | None = None

    @property
    def family(self) -> LossFamily:
        return LOSSES[self.loss][0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def declare(
    *,
    loss: Any,
    feature_norm: Any,
    huber_delta: Any,
    smoothness: Any,
    weak_convexity: Any,
    strong_convexity: Any,
    gradient_norms_within_clip: Any,
) -> GlmDeclaration:
    """Validate the arguments of ``register(model="glm", ...)``."""
    declared = {
        "smoothness": smoothness is not None,
        "weak_convexity": weak_convexity != 0.0,
        "strong_convexity": strong_convexity != 0.0,
        "gradient_norms_within_clip": gradient_norms_within_clip is not False,
    }
    clash = [name for name, given in declared.items() if given]
    if clash:
        raise ValueError(
            f"{', '.join(clash)} must not be given with model='glm': the accountant derives the loss assumptions "
            "from the model, the loss and feature_norm. Remove them, or register without model='glm' to declare "
            f"them by hand. Found {', '.join(clash)}."
        )
    key = loss.strip().lower().replace("-", "_") if isinstance(loss, str) else loss
    key = _ALIASES.get(key, key)
    if key not in LOSSES:
        raise ValueError(
            f"loss must be one of {', '.join(LOSSES)} with model='glm' ("
            + "; ".join(f"{k}: {v[1]}" for k, v in LOSSES.items())
            + "). Squared and hinge losses need a bound on the parameters and labels: compute their constants with "
            f"lastiter_plugins.glm.certify_linear_model and declare them by hand. Found loss={loss!r}."
        )
    try:
        feature_clip.safe_clip_radius(feature_norm, 1, np.float64)
    except ValueError as exc:
        raise ValueError(str(exc).replace("feature_norm_bound", "feature_norm")) from None
    if key == "huber":
        if isinstance(huber_delta, bool) or not isinstance(huber_delta, numbers.Real) or not 0 < huber_delta < math.inf:  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
            raise ValueError(f"huber_delta must be a finite number > 0 for loss='huber'. Found {huber_delta!r}.")
        huber_delta = float(huber_delta)
    elif huber_delta is not None:
        raise ValueError(f"huber_delta is only for loss='huber'. Found huber_delta={huber_delta!r} with loss={key!r}.")
    return GlmDeclaration(loss=key, feature_norm=float(feature_norm), huber_delta=huber_delta)


# ---------------------------------------------------------------- the model


def _leaves_in_order(module: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """Leaf modules in execution order when the model is (nested) nn.Sequential, else None."""
    if not isinstance(module, nn.Sequential) or type(module).forward is not nn.Sequential.forward:
        return None
    out: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        if isinstance(child, nn.Sequential):
            inner = _leaves_in_order(child)
            if inner is None:
                return None
            out.extend((f"{name}.{n}", m) for n, m in inner)
        else:
            out.append((name, child))
    return out


@dataclasses.dataclass(frozen=True)
class Derivation:
    """What was derived at ``make_private``: the certificate and the facts it rests on."""

    certificate: LinearModelCertificate
    clip_norm: float
    weight_decays: tuple[float, ...]
    bias: bool
    num_outputs: int
    feature_dim: int


def _find_structure(model: nn.Module, decl: GlmDeclaration) -> tuple[nn.Linear, FeatureNormClip]:
    trainable = [(n, m) for n, m in model.named_modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    names = [n or type(m).__name__ for n, m in trainable]
    if len(trainable) != 1 or type(trainable[0][1]) is not nn.Linear:
        found = (
            "no trainable parameter"
            if not trainable
            else f"trainable parameters in {len(trainable)} module(s): "
            + ", ".join(f"{n} ({type(m).__name__})" for n, (_, m) in zip(names, trainable, strict=True))
        )
        raise _Error(
            "model='glm' certifies a model whose only trainable layer is a final torch.nn.Linear on clipped "
            "features (layers before it must be frozen: requires_grad=False), since only then is each "
            f"per-example loss phi(<a, x>) of the trained parameters x. Found {found}. {BY_HAND}"
        )
    linear = trainable[0][1]
    if "forward" in vars(linear):
        raise _Error(f"the final nn.Linear's forward must be torch's own. Found it replaced on the instance. {BY_HAND}")
    clips = [m for m in model.modules() if isinstance(m, FeatureNormClip)]
    if not clips:
        raise _Error(
            "model='glm' needs a lastiter_plugins.adapters.opacus.FeatureNormClip(A) right before the final "
            "nn.Linear: it makes every feature vector's norm <= A for every possible example (the neighbouring "
            f"one included), which the constants rest on. Found none in the model. {BY_HAND}"
        )
    leaves = _leaves_in_order(model)
    if leaves is not None:
        position = next(i for i, (_, m) in enumerate(leaves) if m is linear)
        after = leaves[position + 1 :]
        if after:
            raise _Error(
                "the final nn.Linear must be the model's last layer: its output (the score u = <x, a>) must be the "
                "model's output, on which the declared loss is computed; an activation after it changes the loss "
                f"(a sigmoid before BCELoss is not convex in u once the log is clamped). Found "
                f"{', '.join(f'{n} ({type(m).__name__})' for n, m in after)} after it. Remove it and use "
                f"{LOSSES[decl.loss][1]}. {BY_HAND}"
            )
        before = leaves[position - 1][1] if position > 0 else None
        if not isinstance(before, FeatureNormClip):
            raise _Error(
                "the layer right before the final nn.Linear must be FeatureNormClip(A): anything between them "
                "(dropout rescales, a normalisation shifts) can make a feature norm exceed A. Found "
                f"{type(before).__name__ if before is not None else 'nothing'} before it. {BY_HAND}"
            )
        clip = before
    elif len(clips) == 1:
        clip = clips[0]  # the order is checked in every forward (the Linear's input is the clip's output)
    else:
        raise _Error(
            "model='glm' needs exactly one FeatureNormClip when the model is not an nn.Sequential (the adapter "
            f"checks in every forward that the final nn.Linear's input is its output). Found {len(clips)}."
        )
    if type(clip) is not FeatureNormClip or "forward" in vars(clip):
        raise _Error(
            f"the feature clip must be FeatureNormClip itself (its forward is what bounds the norms). Found "
            f"{type(clip).__name__}{' with forward replaced' if 'forward' in vars(clip) else ''}."
        )
    if clip.feature_norm_bound > decl.feature_norm:
        raise _Error(
            f"the FeatureNormClip's bound must be <= the registered feature_norm = {decl.feature_norm:g}. Found "
            f"FeatureNormClip({clip.feature_norm_bound:g}). Register feature_norm={clip.feature_norm_bound:g}."
        )
    return linear, clip


def _check_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    base = getattr(optimizer, "original_optimizer", optimizer)
    if type(base) is not torch.optim.SGD:
        raise _Error(
            "model='glm' derives the constants for plain SGD, x <- x - lr (noisy clipped mean + weight_decay x). "
            f"Found {type(base).__name__}: no bound covers adaptive or momentum methods, whatever constants are "
            "declared. Use torch.optim.SGD (momentum=0)."
        )
    return base


def derive(
    module: Any,
    optimizer: Any,
    *,
    clip_norm: Any,
    reg: Registration,
    batch_size: int,
    normaliser: float,
) -> tuple[Derivation, nn.Module, nn.Linear, FeatureNormClip]:
    """Derive the loss assumptions of the model, or refuse naming what to change or to declare by hand.

    Args:
      module: the private module (or the model before make_private).
      optimizer: the DPOptimizer or the torch optimizer it wraps.
      clip_norm: C (max_grad_norm).
      reg: the registration (declaration and diameter).
      batch_size: b of the core (the noisy sum is compared to b examples).
      normaliser: N, what Opacus divides the noisy sum by (expected batch size for 'mean', 1 for 'sum').
    """
    decl = reg.glm
    assert decl is not None  # the GLM route exists for model="glm" only
    if not isinstance(module, nn.Module):
        raise _Error(
            "model='glm' reads the model the accountant is attached to: make_private must wrap it "
            f"(wrap_model=True, the default), or pass module= to bind_data_loader. Found {type(module).__name__}."
        )
    model = unwrap(module)
    base = _check_optimizer(optimizer)
    linear, clip = _find_structure(model, decl)
    params = [p for g in base.param_groups for p in g["params"] if p.requires_grad]
    mine = [p for p in linear.parameters() if p.requires_grad]
    if {id(p) for p in params} != {id(p) for p in mine}:
        raise _Error(
            "the optimizer must train exactly the final nn.Linear's parameters. Found "
            f"{len(params)} trainable tensors in the optimizer and {len(mine)} in the Linear. {BY_HAND}"
        )
    k = int(linear.out_features)
    family = decl.family
    if family is LossFamily.SOFTMAX_CROSS_ENTROPY and k < 2:
        raise _Error(f"loss='softmax' needs an nn.Linear with >= 2 outputs (one per class). Found {k}.")
    if family is not LossFamily.SOFTMAX_CROSS_ENTROPY and k != 1:
        raise _Error(
            f"loss={decl.loss!r} is a scalar GLM: the final nn.Linear must have one output. Found out_features={k} "
            "(several outputs with a per-output loss are not one GLM; for classes use loss='softmax')."
        )
    if isinstance(clip_norm, bool) or not isinstance(clip_norm, numbers.Real) or not 0 < clip_norm < math.inf:  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
        raise _Error(f"max_grad_norm must be one finite number > 0 (flat clipping). Found {clip_norm!r}.")
    decays = []
    for i, group in enumerate(base.param_groups):
        value = _number(group.get("weight_decay", 0.0))
        if not (math.isfinite(value) and value >= 0):
            raise _Error(f"weight_decay must be a finite number >= 0. Found {value!r} in param_groups[{i}].")
        decays.append(value)
    used = [w for w, g in zip(decays, base.param_groups, strict=True) if any(p.requires_grad for p in g["params"])]
    used = used or [0.0]
    # torch adds lr * w * x after the noisy mean (sum / N); in the core's terms (step lr * b / N on the
    # mean over b examples) the l2 coefficient is w * N / b.
    scale = normaliser / batch_size
    bias = linear.bias is not None and linear.bias.requires_grad
    certificate = certify_linear_model(
        family,
        feature_norm_bound=decl.feature_norm,
        clip_norm=float(clip_norm),
        bias=bias,
        num_classes=k if family is LossFamily.SOFTMAX_CROSS_ENTROPY else None,
        l2=max(used) * scale,
        l2_placement="outside_clip",
        l2_covers_all_parameters=min(used) == max(used),
        projection_radius=None if reg.assumptions.diameter is None else reg.assumptions.diameter / 2.0,
        huber_delta=decl.huber_delta,
    )
    if not certificate.certified:
        raise _Error(f"{certificate.not_certified} (clip_norm is make_private's max_grad_norm.)")
    derivation = Derivation(
        certificate=certificate,
        clip_norm=float(clip_norm),
        weight_decays=tuple(decays),
        bias=bias,
        num_outputs=k,
        feature_dim=int(linear.in_features),
    )
    return derivation, model, linear, clip


def assumptions_of(derivation: Derivation) -> lp.LossAssumptions:
    return lp.LossAssumptions(**derivation.certificate.loss_assumption_kwargs())


# ---------------------------------------------------------------- per-forward and per-step checks


def check_loss_module(loss: Any, decl: GlmDeclaration, loss_reduction: str) -> None:
    """The loss module is the declared loss exactly: its class, and every parameter that changes the
    loss' curvature or scale (weights, pos_weight, label smoothing, delta; the reduction make_private's
    loss_reduction says). Raises LastIterateConfigurationError naming the parameter."""
    kind, fixed = LOSS_MODULES[decl.loss]
    name = f"loss={decl.loss!r}"
    if type(loss) is not kind or "forward" in vars(loss):
        smooth_l1 = (
            " (SmoothL1Loss(beta) is HuberLoss(delta=beta) / beta: its curvature is 1/beta)"
            if isinstance(loss, nn.SmoothL1Loss)
            else ""
        )
        raise _Error(
            f"the loss module must be {kind.__module__.split('.')[0]}.nn.{kind.__name__} itself for {name}, whose "
            f"constants were derived for it. Found {type(loss).__name__}"
            f"{' with forward replaced' if 'forward' in vars(loss) else ''}{smooth_l1}. Use "
            f"{LOSSES[decl.loss][1]}. {BY_HAND}"
        )
    for attribute, value in {**fixed, "reduction": loss_reduction}.items():
        expected = decl.huber_delta if attribute == "delta" else value
        found = getattr(loss, attribute, None)
        same = found is None if expected is None else (found == expected and not torch.is_tensor(found))
        if not same:
            raise _Error(
                f"{kind.__name__}.{attribute} must be {expected!r} for {name} (the derived constants assume "
                f"it{'; make_private loss_reduction' if attribute == 'reduction' else ''}). Found "
                f"{'a tensor' if torch.is_tensor(found) else repr(found)}. {BY_HAND}"
            )


def _view_of(tensor: Any, base: torch.Tensor) -> bool:
    """``tensor`` holds exactly ``base``'s elements: the tensor itself or a view of it (a reshape, a squeeze)."""
    return (
        torch.is_tensor(tensor)
        and tensor.numel() == base.numel()
        and tensor.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        and tensor.storage_offset() == base.storage_offset()
    )


class Watch:
    """Forward hooks on the model, its FeatureNormClip, its final Linear and the loss module, and the per-step check.

    Per training forward (training mode, gradients on): the Linear's input is the clip's output, 2-D, with
    every row of norm <= A; the Linear runs once; its output is the model's output; the loss module is called
    once on it. Per step: clip norm, weight decay and the loss module unchanged, per-example gradients rank one
    (on a sample) and, per example, the gradient of the declared loss at its score and label.
    """

    def __init__(
        self, model: nn.Module, linear: nn.Linear, clip: FeatureNormClip, decl: GlmDeclaration, d: Derivation | None
    ):
        self.decl, self.derivation = decl, d
        self._model, self._linear, self._clip = weakref.ref(model), weakref.ref(linear), weakref.ref(clip)
        self.failure: str | None = None
        self._clip_out: Any = None
        self._linear_calls = 0
        self._current: tuple[torch.Tensor, torch.Tensor] | None = None
        self.record: tuple[torch.Tensor, torch.Tensor] | None = None
        self._loss: Any = None  # weak reference to the loss module
        self._loss_handle: Any = None
        self._loss_checked: tuple | None = None  # what check_loss_module last accepted (check_configuration)
        self.loss_calls: list[tuple[torch.Tensor, torch.Tensor]] = []  # (input, target) on the record's output
        self._unchecked: list[torch.Tensor] = []  # the Linear's inputs since the last step (norms not yet checked)
        me = weakref.ref(self)
        self._handles = [
            model.register_forward_pre_hook(_call(me, "_top_pre")),
            model.register_forward_hook(_call(me, "_top_post")),
            clip.register_forward_hook(_call(me, "_clip_post")),
            linear.register_forward_hook(_call(me, "_linear_post")),
        ]

    def remove(self) -> None:
        for handle in [*self._handles, *([self._loss_handle] if self._loss_handle is not None else [])]:
            handle.remove()
        self._handles, self._loss_handle = [], None

    def bind_loss(self, loss: nn.Module, loss_reduction: str) -> None:
        """Check the loss module against the declaration and hook it (once per module)."""
        check_loss_module(loss, self.decl, loss_reduction)
        if self._loss is not None and self._loss() is loss:
            return
        if self._loss_handle is not None:
            self._loss_handle.remove()
        self._loss = weakref.ref(loss)
        self._loss_handle = loss.register_forward_hook(_call(weakref.ref(self), "_loss_post"), with_kwargs=True)

    def watches(self, model: nn.Module, linear: Any = None, clip: Any = None) -> bool:
        return (
            self._model() is model
            and (linear is None or self._linear() is linear)
            and (clip is None or self._clip() is clip)
        )

    def fail(self, message: str) -> NoReturn:
        self.failure = message
        raise _Changed(message)

    @staticmethod
    def _recording(module: nn.Module) -> bool:
        return module.training and torch.is_grad_enabled()

    # -- forward hooks
    def _top_pre(self, module: nn.Module, args: Any) -> None:
        if self._recording(module):
            self._clip_out, self._linear_calls, self._current = None, 0, None

    def _clip_post(self, module: nn.Module, args: Any, output: Any) -> None:
        model = self._model()
        if model is not None and self._recording(model):
            self._clip_out = output

    def _linear_post(self, module: nn.Module, args: Any, output: Any) -> None:
        model = self._model()
        if model is None or not self._recording(model):
            return
        self._linear_calls += 1
        features = args[0] if args else None
        if features is None or features is not self._clip_out:
            self.fail(
                "the final nn.Linear's input must be the output of the FeatureNormClip in every training forward: "
                "the constants rest on every feature norm being <= A. Found features that did not come from the "
                "clip (it was removed or bypassed after registration, or another module sits between them). "
                "The run's epsilon is void."
            )
        if features.dim() != 2:
            self.fail(
                "the final nn.Linear's input must be one feature vector per example, shape (batch, d). Found shape "
                f"{tuple(features.shape)}: a Linear applied per position sums several rank-one gradients, which is "
                "not one GLM. The run's epsilon is void."
            )
        features = features.detach()
        if len(self._unchecked) >= _UNCHECKED_MAX:  # many training forwards without a step: check them now
            self._check_norms(self._unchecked)
            self._unchecked = []
        self._unchecked.append(features)  # their norms are checked at the step, with the loss (one host read)
        self._current = (features, output.detach())

    def _top_post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._recording(module):
            return
        if self._linear_calls != 1:
            self.fail(
                f"the final nn.Linear must run exactly once per forward of the model (one score per example). "
                f"Found {self._linear_calls} calls in one forward. The run's epsilon is void."
            )
        if self._current is None or (output is not self._current[1] and not _same(output, self._current[1])):
            self.fail(
                "the model's output must be the final nn.Linear's output: the declared loss is a function of the "
                "score u = <x, a>, and an operation after the Linear (an activation, a scaling) changes the loss. "
                "Found another tensor. The run's epsilon is void."
            )
        self.record = self._current
        self.loss_calls = []

    def _loss_post(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if self.record is None or not torch.is_grad_enabled():
            return
        scores = args[0] if args else kwargs.get("input")
        if _view_of(scores, self.record[1]):  # on the output of the last training forward (not a copy of it)
            target = args[1] if len(args) > 1 else kwargs.get("target")
            self.loss_calls.append((scores.detach(), target.detach() if torch.is_tensor(target) else target))

    # -- the step
    def check_configuration(self, optim: Any) -> None:
        """What the constants were derived for and the optimizer check does not see: the clip norm (the
        accountant then checks that it stays the first step's), the FeatureNormClip's bound and the loss module.
        (The weight decay per group is the optimizer check's, against the derived values; a parameter frozen
        after make_private is the trained-parameters check's.)"""
        if self.failure is not None:
            raise _Changed(self.failure)
        d = self.derivation
        assert d is not None  # derived (GlmRoute.derive_at_step) before the step checks
        if optim.max_grad_norm != d.clip_norm:
            self.fail(
                f"max_grad_norm must stay {d.clip_norm:g}, the clip norm the constants were derived for. "
                f"Found {optim.max_grad_norm!r}. The run's epsilon is void."
            )
        clip = self._clip()
        if clip is None or clip.feature_norm_bound > self.decl.feature_norm:
            self.fail(
                f"the FeatureNormClip must keep a bound <= feature_norm = {self.decl.feature_norm:g}. Found "
                f"{'no clip' if clip is None else clip.feature_norm_bound}. The run's epsilon is void."
            )
        loss = self._loss() if self._loss is not None else None
        if loss is None and self._loss is not None:  # given, then garbage-collected: only a weak reference is kept
            self.fail(
                f"model='glm' must see the loss computed with the module of loss={self.decl.loss!r} given to "
                "make_private(criterion=...), but that module no longer exists (it was created in the call and "
                "nothing else kept it). Keep it in a variable (criterion = nn.BCEWithLogitsLoss()), pass it, and "
                "compute the loss with it. The run's epsilon is void."
            )
        if loss is None:
            self.fail(
                f"model='glm' must see the loss computed with the module of loss={self.decl.loss!r} "
                f"({LOSSES[self.decl.loss][1]}): pass it to make_private(criterion=...) (or to "
                "bind_data_loader(..., loss=...)) and call it on the model's output. Found no loss module given. "
                "The run's epsilon is void."
            )
        # (checked in full when a value check_loss_module reads differs from the last step's)
        attributes = (loss, type(loss), "forward" in vars(loss), optim.loss_reduction)
        key = immutable_key(tuple(getattr(loss, a, None) for a in (*LOSS_MODULES[self.decl.loss][1], "reduction")))
        if key is None or (attributes, key) != self._loss_checked:
            try:
                check_loss_module(loss, self.decl, optim.loss_reduction)
            except _Error as exc:
                self.fail(f"{exc} The run's epsilon is void.")
            self._loss_checked = (attributes, key)

    def check_examples(self, optim: Any) -> None:
        """The step's per-example gradients against the last training forward: the Linear's, rank one, and
        per example the declared loss' gradient at its score and label; every feature row since the last
        step of norm <= A."""
        linear = self._linear()
        record, self.record = self.record, None
        calls, self.loss_calls = self.loss_calls, []
        unchecked, self._unchecked = self._unchecked, []
        if record is None:
            self.fail(
                "every step must follow a training forward of the registered model (the per-example gradients "
                "are checked against its features). Found none since the last step (another model or module was "
                "called). The run's epsilon is void."
            )
        features = record[0]
        assert linear is not None  # it ran in the recorded forward
        weight = getattr(linear.weight, "grad_sample", None)
        if not torch.is_tensor(weight) or weight.dim() != 3 or weight.shape[0] != features.shape[0]:
            shape = tuple(weight.shape) if torch.is_tensor(weight) else type(weight).__name__
            self.fail(
                "the per-example gradients of the final nn.Linear must come from its last training forward, one "
                f"(outputs x features) matrix per example of that batch ({features.shape[0]} examples). Found "
                f"{shape}. The run's epsilon is void."
            )
        if len(calls) != 1:
            self.fail(
                f"the loss of every step must be one call of the loss module ({type(self._loss()).__name__}) on the "
                "model's output (or a view of it: a squeeze, a reshape), whose per-example gradients are checked "
                f"against the declared loss. Found {len(calls)} calls on the output of the last training forward (a "
                "loss computed by another function or on a transformed output, or the loss module called several "
                f"times).{_low_precision(record[1].dtype)} The run's epsilon is void."
            )
        if features.shape[0] == 0:  # an empty Poisson batch: the step adds noise only, nothing to compare
            self._check_norms(unchecked)
            return
        self._check_rank_one()
        self._check_loss(self._backprops(weight, features, linear), *calls[0], features, unchecked)

    def _backprops(self, weight: torch.Tensor, features: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
        """dloss_i/du_i per example: the bias' per-example gradient, else the projection of the weight's onto a_i."""
        assert self.derivation is not None  # derived before the step checks
        if self.derivation.bias:
            bias = getattr(linear.bias, "grad_sample", None)
            if not torch.is_tensor(bias) or bias.shape != weight.shape[:2]:
                self.fail("the bias' per-example gradients must match the weight's. The run's epsilon is void.")
            return bias
        a = features.to(weight.dtype)
        squares = torch.sum(a * a, dim=1).clamp_min(torch.finfo(weight.dtype).tiny)
        return torch.einsum("bkd,bd->bk", weight, a) / squares[:, None]

    def _check_rank_one(self) -> None:
        """Opacus computes the Linear's per-example gradients with its own grad sampler, which forms
        dloss/du (outer) feature row: rank one on 2-D features (checked in every forward). A grad sampler
        registered in its place could return anything, so it is refused."""
        if not internals.opacus_linear_grad_sampler():
            self.fail(
                "the per-example gradient of the final nn.Linear must be rank one, dloss/du (outer) feature, as "
                "for every GLM, which Opacus' own grad sampler for nn.Linear computes. Found another grad sampler "
                f"registered for nn.Linear (a custom grad sampler). {BY_HAND} The run's epsilon is void."
            )

    def _check_loss(
        self, backprop: torch.Tensor, scores: torch.Tensor, target: Any, features: torch.Tensor, unchecked: list
    ) -> None:
        """Per example, dloss/du (Opacus' per-example gradient, undone of the mean) is the declared loss'
        gradient at the example's score and label: any other loss, scale or extra term shows here. Computed
        in the gradients' dtype (float32 rounding is far below the tolerance); read back once, with the
        largest squared feature norm since the last step (:meth:`_check_norms`)."""
        rows = backprop.shape[0]
        if not torch.is_tensor(target) or target.shape[0] != rows:
            self.fail(
                f"the loss module's target must be a tensor with one row per example ({rows}). Found "
                f"{tuple(target.shape) if torch.is_tensor(target) else type(target).__name__}. The run's epsilon is "
                "void."
            )
        dtype = backprop.dtype if backprop.dtype.is_floating_point else torch.float64
        u, gradient = _rows(scores, dtype, rows), _rows(backprop, dtype, rows)
        family = self.decl.family
        read: list[torch.Tensor] = []  # scalars read back with the largest difference
        if family is LossFamily.SOFTMAX_CROSS_ENTROPY:
            k = u.shape[1]
            if target.dtype.is_floating_point:  # class probabilities
                q = _rows(target, dtype, rows)
                labels_bad = (q.min() < 0) | (torch.max(torch.abs(q.sum(1) - 1)) > _TOLERANCE)
                needed = "class probabilities (non-negative, summing to 1)"
            else:
                classes = target.reshape(rows)
                labels_bad = ~((classes >= 0) & (classes < k)).all()
                needed = f"class indices in [0, {k}) (none equal to ignore_index)"
                q = (classes[:, None] == torch.arange(k, device=classes.device)).to(dtype)  # one-hot (0: out of range)
            read.append(labels_bad.to(dtype))
            difference = torch.softmax(u, dim=1).sub_(q)
        else:
            y = _rows(target, dtype, rows)
            if family is LossFamily.BINARY_LOGISTIC:
                read.extend(torch.aminmax(y))  # in [0, 1]
                needed = "labels in [0, 1]"
                difference = torch.sigmoid(u).sub_(y)
            else:
                needed = ""
                assert self.decl.huber_delta is not None  # declare() requires it for loss='huber'
                difference = torch.clamp(u - y, -self.decl.huber_delta, self.decl.huber_delta)
        difference = difference.sub_(gradient).abs_()
        assert self.derivation is not None  # derived before the step checks
        if not self.derivation.bias:  # rows with a zero feature vector carry no information on dloss/du
            difference = difference * (torch.linalg.vecdot(features, features)[:, None] > 0)
        squares = _largest_square(unchecked)
        if squares is not None and squares.dtype == difference.dtype:
            read.append(squares)
        worst, *labels = torch.stack([difference.max(), *read]).tolist()
        if squares is not None:
            self._judge_norm(labels.pop() if squares.dtype == difference.dtype else squares.item(), unchecked)
        if family is LossFamily.BINARY_LOGISTIC:
            labels_ok = labels[0] >= 0 and labels[1] <= 1  # (NaN labels fail)
        else:
            labels_ok = family is not LossFamily.SOFTMAX_CROSS_ENTROPY or not labels[0]
        if not labels_ok:
            self._wrong_labels(needed)
        scale = max(1.0, self.decl.huber_delta or 1.0)
        if not worst <= _TOLERANCE * scale:
            self.fail(
                f"the gradient of each example's loss with respect to its score must be that of loss="
                f"{self.decl.loss!r} ({LOSSES[self.decl.loss][1]}) at the example's score and label, reduced as "
                f"make_private's loss_reduction says. Found a difference of up to {worst:.4g}: the loss was scaled, "
                f"another term was added to it, or another loss was backpropagated.{_low_precision(scores.dtype)} "
                f"{BY_HAND} The run's epsilon is void."
            )

    def _check_norms(self, features: list) -> None:
        """Every row of ``features`` (the final Linear's inputs) has l2 norm <= A."""
        squares = _largest_square(features)
        if squares is not None:
            self._judge_norm(float(squares), features)

    def _judge_norm(self, largest_square: float, features: list) -> None:
        """Accept when the bound on the exact largest square from its value in the features' dtype is <= A^2
        (:func:`_square_bound`); else decide in float64 (:func:`feature_norms_ok`: exact squares of float32,
        a row accepted only if its exact norm is <= A), which also names the norm found."""
        bound = self.decl.feature_norm
        if _square_bound(largest_square, features) <= bound * bound * (1.0 - 4 * 2.0**-53):
            return
        largest = 0.0
        for f in features:
            ok, norm = feature_norms_ok(f, bound)
            largest = norm if not math.isfinite(norm) else max(largest, norm)
            if not ok:
                self.fail(
                    f"every feature vector entering the final nn.Linear must have l2 norm <= feature_norm = "
                    f"{bound:g}. Found norm {largest:.17g} (non-finite features, or a clip with another bound). "
                    "The run's epsilon is void."
                )

    def _wrong_labels(self, needed: str) -> NoReturn:
        self.fail(
            f"the targets of loss={self.decl.loss!r} must be {needed}, for which the constants were derived. "
            f"Found others. {BY_HAND} The run's epsilon is void."
        )


def _low_precision(dtype: torch.dtype) -> str:
    """The cause when the model's scores are half precision (torch.autocast, a half model), else ''."""
    if dtype not in (torch.bfloat16, torch.float16):
        return ""
    return (
        f" The model's output is {dtype} (torch.autocast, or a half-precision model): the GLM route checks each "
        "example's gradient against the declared loss at its score, which needs float32 scores (bfloat16 rounding "
        "alone moves the gradient by up to 0.004; the loss computed on output.float() is another tensor). Train the "
        "GLM in float32, outside torch.autocast (autocast is fine on the declared route)."
    )


def _number(value: Any) -> float:
    return float(value.item() if torch.is_tensor(value) else value)


def _same(a: Any, b: Any) -> bool:
    """A view of the same storage (GradSampleModule may return the inner output unchanged or as a view)."""
    return (
        torch.is_tensor(a)
        and torch.is_tensor(b)
        and a.shape == b.shape
        and a.data_ptr() == b.data_ptr()
        and a.stride() == b.stride()
    )


def _call(ref: Any, method: str) -> Any:
    def hook(*args: Any) -> Any:
        watch = ref()
        return None if watch is None else getattr(watch, method)(*args)

    return hook


# ---------------------------------------------------------------- the route


class GlmRoute:
    """The GLM route (``model="glm"``) as one more check of the accountant: it derives the loss
    assumptions from the model (at ``make_private``, at the first step after ``bind_data_loader``, or
    from a ``make_private_with_epsilon`` call) and watches the loss and the model's structure at every
    forward and step (:class:`Watch`). ``registration`` is the declaration with the derived constants
    once derived (the state the accountant computes with), else the declaration.
    """

    def __init__(self, declared: Registration) -> None:
        assert declared.glm is not None  # created for model="glm" only
        self.declared = declared
        self.decl: GlmDeclaration = declared.glm
        self.registration = declared
        self.derivation: Derivation | None = None
        self.watch: Watch | None = None
        self._module: Any = None  # weak reference to the module given to bind_data_loader
        self._facts: Any = None

    def _adopt(
        self, module: Any, optim: Any, clip_norm: Any, batch_size: int, normaliser: float, *, watch: bool = True
    ) -> None:
        reg = self.declared
        derivation, model, linear, clip = derive(
            module, optim, clip_norm=clip_norm, reg=reg, batch_size=batch_size, normaliser=normaliser
        )
        if watch and self.watch is not None and self.watch.watches(model, linear, clip):
            self.watch.derivation = derivation  # hooked at bind_data_loader: keep what it recorded
        else:
            if self.watch is not None:
                self.watch.remove()
                self.watch = None
            if watch:
                self.watch = Watch(model, linear, clip, self.decl, derivation)
        self.derivation = derivation
        # the derived constants, and the weight decay the optimizer check must accept
        self.registration = dataclasses.replace(
            reg, assumptions=assumptions_of(derivation), weight_decays=derivation.weight_decays
        )

    def at_make_private(self, caller: dict[str, Any]) -> None:
        """Derive from the model, optimizer and loader ``make_private`` prepared; hook the loss module given."""
        reg = self.declared
        optim = caller["optimizer"]
        facts = check_data_loader(caller["data_loader"], reg.sampling, reg.dataset_size)
        self._adopt(caller["module"], optim, optim.max_grad_norm, core_batch(reg, facts), optimizer_normaliser(optim))
        criterion = caller.get("criterion")
        if criterion is not None and criterion is not internals.DEFAULT_CRITERION:  # given by the user
            assert self.watch is not None  # _adopt hooked the model (watch=True)
            self.watch.bind_loss(criterion, optim.loss_reduction)

    def bind(self, facts: Any, module: nn.Module | None, loss: nn.Module | None) -> None:
        """``bind_data_loader``: hook the model now (so that the first forward is seen); derive at the first step."""
        if loss is not None and not isinstance(loss, nn.Module):
            raise _Error(f"loss must be a torch.nn.Module (the loss module). Found {type(loss).__name__}.")
        if module is None or self.watch is None or not self.watch.watches(unwrap(module)):
            if self.watch is not None:
                self.watch.remove()
            self.watch = self.derivation = None
            self.registration = self.declared  # back to the declaration until the model is derived
            self._module = None if module is None else weakref.ref(module)
            if isinstance(module, nn.Module):
                model = unwrap(module)
                linear, clip = _find_structure(model, self.decl)
                self.watch = Watch(model, linear, clip, self.decl, None)
        if loss is not None and self.watch is not None:  # (the reduction is checked against the optimizer's
            self.watch.bind_loss(loss, getattr(loss, "reduction", "mean"))  # loss_reduction at every step)
        self._facts = facts

    def derive_at_step(self, optim: Any) -> None:
        """Derive at the first step when the model was hooked by ``bind_data_loader`` (outside make_private)."""
        if self.derivation is not None:
            return
        module = self._module() if self._module is not None else None
        if module is None or self._facts is None:
            raise _Changed(
                "model='glm' derives the loss assumptions from the model: create the optimizer with "
                "PrivacyEngine.make_private, or call engine.accountant.bind_data_loader(data_loader, "
                "module=model) before training. Found no model."
            )
        batch, normaliser = core_batch(self.declared, self._facts), optimizer_normaliser(optim)
        try:
            self._adopt(module, optim, optim.max_grad_norm, batch, normaliser)
        except _Error as exc:
            raise _Changed(str(exc)) from None

    def before_epsilon(self, name: str, steps: int) -> None:
        """A failure of the watch voids the run; Opacus' calibration derives from its call."""
        if self.watch is not None and self.watch.failure is not None:
            raise _Changed(f"accountant {name!r} refused this run: {self.watch.failure}")
        if self.derivation is None and steps:
            call = internals.engine_locals("make_private_with_epsilon", depth=16)
            if call is None:
                raise _Error(
                    "model='glm' derives the loss assumptions from the model at make_private; this accountant has "
                    "not seen one. Call PrivacyEngine.make_private (or make_private_with_epsilon) first."
                )
            self._adopt_planned(call)

    def _adopt_planned(self, call: dict[str, Any]) -> None:
        """Derive from a make_private_with_epsilon call (Opacus' calibration, before the model is wrapped)."""
        reg = self.declared
        loader = call["data_loader"]
        n, batches = len(loader.dataset), len(loader)
        if call["poisson_sampling"]:
            b = poisson_batch_size(reg.dataset_size, 1.0 / batches)
        else:
            b = core_batch(reg, check_data_loader(loader, reg.sampling, reg.dataset_size))
        normaliser = planned_normaliser(call["loss_reduction"], n, 1.0 / batches)
        # Opacus' calibration runs on a temporary accountant: derive without hooking the model
        self._adopt(call["module"], call["optimizer"], call["max_grad_norm"], b, normaliser, watch=False)

    def before_load(self) -> None:
        if self.derivation is None:
            raise _Error(
                "model='glm' derives the loss assumptions from the model: call make_private before loading the "
                "accountant's state, so that the checkpoint's constants can be compared with the model's."
            )
