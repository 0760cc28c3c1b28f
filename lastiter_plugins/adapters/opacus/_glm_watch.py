"""The per-forward and per-step checks of the GLM route: the loss module is the declared one
(:func:`check_loss_module`), and :class:`Watch` (hooks on the model, its clip, its final Linear and the
loss module; the check inside the accountant's step sequence)."""

from __future__ import annotations

import math
import weakref
from typing import Any, NoReturn

import torch
from torch import nn

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError, LastIteratePipelineChangedError
from lastiter_plugins.adapters.opacus._glm_clip import FeatureNormClip, feature_norms_ok, largest_square, square_bound
from lastiter_plugins.adapters.opacus._glm_declaration import BY_HAND, LOSS_MODULES, LOSSES, GlmDeclaration
from lastiter_plugins.adapters.opacus._glm_derive import Derivation
from lastiter_plugins.adapters.opacus._record import immutable_key
from lastiter_plugins.glm import LossFamily

_Error = LastIterateConfigurationError


class GlmBroken(LastIteratePipelineChangedError):
    """A fact the derived constants rest on broke (the GLM route's check turns it into a departure: the rows
    needing the derived assumptions leave; raised anywhere else, it refuses)."""


#: Relative tolerance of the per-step structure checks (float32 arithmetic of Opacus' grad samplers).
_TOLERANCE = 1e-4
#: Training forwards whose features wait for the step's norm check (more are checked at once).
_UNCHECKED_MAX = 8


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
        raise GlmBroken(message)

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
                "clip (it was removed or bypassed after registration, or another module sits between them)."
            )
        if features.dim() != 2:
            self.fail(
                "the final nn.Linear's input must be one feature vector per example, shape (batch, d). Found shape "
                f"{tuple(features.shape)}: a Linear applied per position sums several rank-one gradients, which is "
                "not one GLM."
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
                f"Found {self._linear_calls} calls in one forward."
            )
        if self._current is None or (output is not self._current[1] and not _same(output, self._current[1])):
            self.fail(
                "the model's output must be the final nn.Linear's output: the declared loss is a function of the "
                "score u = <x, a>, and an operation after the Linear (an activation, a scaling) changes the loss. "
                "Found another tensor."
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
            raise GlmBroken(self.failure)
        d = self.derivation
        assert d is not None  # derived (GlmRoute.derive_at_step) before the step checks
        if optim.max_grad_norm != d.clip_norm:
            self.fail(
                f"max_grad_norm must stay {d.clip_norm:g}, the clip norm the constants were derived for. "
                f"Found {optim.max_grad_norm!r}."
            )
        clip = self._clip()
        if clip is None or clip.feature_norm_bound > self.decl.feature_norm:
            self.fail(
                f"the FeatureNormClip must keep a bound <= feature_norm = {self.decl.feature_norm:g}. Found "
                f"{'no clip' if clip is None else clip.feature_norm_bound}."
            )
        loss = self._loss() if self._loss is not None else None
        if loss is None and self._loss is not None:  # given, then garbage-collected: only a weak reference is kept
            self.fail(
                f"model='glm' must see the loss computed with the module of loss={self.decl.loss!r} given to "
                "make_private(criterion=...), but that module no longer exists (it was created in the call and "
                "nothing else kept it). Keep it in a variable (criterion = nn.BCEWithLogitsLoss()), pass it, and "
                "compute the loss with it."
            )
        if loss is None:
            self.fail(
                f"model='glm' must see the loss computed with the module of loss={self.decl.loss!r} "
                f"({LOSSES[self.decl.loss][1]}): pass it to make_private(criterion=...) (or to "
                "bind_data_loader(..., loss=...)) and call it on the model's output. Found no loss module given."
            )
        # (checked in full when a value check_loss_module reads differs from the last step's)
        attributes = (loss, type(loss), "forward" in vars(loss), optim.loss_reduction)
        key = immutable_key(tuple(getattr(loss, a, None) for a in (*LOSS_MODULES[self.decl.loss][1], "reduction")))
        if key is None or (attributes, key) != self._loss_checked:
            try:
                check_loss_module(loss, self.decl, optim.loss_reduction)
            except _Error as exc:
                self.fail(f"{exc}")
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
                "called)."
            )
        features = record[0]
        assert linear is not None  # it ran in the recorded forward
        weight = getattr(linear.weight, "grad_sample", None)
        if not torch.is_tensor(weight) or weight.dim() != 3 or weight.shape[0] != features.shape[0]:
            shape = tuple(weight.shape) if torch.is_tensor(weight) else type(weight).__name__
            self.fail(
                "the per-example gradients of the final nn.Linear must come from its last training forward, one "
                f"(outputs x features) matrix per example of that batch ({features.shape[0]} examples). Found "
                f"{shape}."
            )
        if len(calls) != 1:
            self.fail(
                f"the loss of every step must be one call of the loss module ({type(self._loss()).__name__}) on the "
                "model's output (or a view of it: a squeeze, a reshape), whose per-example gradients are checked "
                f"against the declared loss. Found {len(calls)} calls on the output of the last training forward (a "
                "loss computed by another function or on a transformed output, or the loss module called several "
                f"times).{_low_precision(record[1].dtype)}"
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
                self.fail("the bias' per-example gradients must match the weight's.")
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
                f"registered for nn.Linear (a custom grad sampler). {BY_HAND}"
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
                f"{tuple(target.shape) if torch.is_tensor(target) else type(target).__name__}."
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
        squares = largest_square(unchecked)
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
                f"{BY_HAND}"
            )

    def _check_norms(self, features: list) -> None:
        """Every row of ``features`` (the final Linear's inputs) has l2 norm <= A."""
        squares = largest_square(features)
        if squares is not None:
            self._judge_norm(float(squares), features)

    def _judge_norm(self, largest_square: float, features: list) -> None:
        """Accept when the bound on the exact largest square from its value in the features' dtype is <= A^2
        (:func:`square_bound`); else decide in float64 (:func:`feature_norms_ok`: exact squares of float32,
        a row accepted only if its exact norm is <= A), which also names the norm found."""
        bound = self.decl.feature_norm
        if square_bound(largest_square, features) <= bound * bound * (1.0 - 4 * 2.0**-53):
            return
        largest = 0.0
        for f in features:
            ok, norm = feature_norms_ok(f, bound)
            largest = norm if not math.isfinite(norm) else max(largest, norm)
            if not ok:
                self.fail(
                    f"every feature vector entering the final nn.Linear must have l2 norm <= feature_norm = "
                    f"{bound:g}. Found norm {largest:.17g} (non-finite features, or a clip with another bound)."
                )

    def _wrong_labels(self, needed: str) -> NoReturn:
        self.fail(
            f"the targets of loss={self.decl.loss!r} must be {needed}, for which the constants were derived. "
            f"Found others. {BY_HAND}"
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
    """A hook calling ``method`` of the watch (held weakly); a broken fact is recorded (``failure``), never
    raised into the user's forward, and the watch stops checking."""

    def hook(*args: Any) -> Any:
        watch = ref()
        if watch is None or watch.failure is not None:
            return None
        try:
            return getattr(watch, method)(*args)
        except GlmBroken:
            return None

    return hook


def _rows(tensor: torch.Tensor, dtype: torch.dtype, rows: int) -> torch.Tensor:
    """``tensor`` as a (rows, -1) matrix of ``dtype`` (itself when it already is one: no torch call)."""
    if tensor.dtype is dtype and tensor.dim() == 2 and tensor.shape[0] == rows:
        return tensor
    return tensor.to(dtype).reshape(rows, -1)
