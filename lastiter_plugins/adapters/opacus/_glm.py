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

This module holds the route (:class:`GlmRoute`); the feature clip is ``_glm_clip``, the declaration
``_glm_declaration``, the model's structure and the derived constants ``_glm_derive``, the per-forward
and per-step checks ``_glm_watch``.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from torch import nn

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError, LastIteratePipelineChangedError
from lastiter_plugins.adapters.opacus._glm_clip import FeatureNormClip  # noqa: F401  (models saved whole name this path)
from lastiter_plugins.adapters.opacus._glm_declaration import GlmDeclaration
from lastiter_plugins.adapters.opacus._glm_derive import Derivation, assumptions_of, derive, find_structure
from lastiter_plugins.adapters.opacus._glm_watch import Watch
from lastiter_plugins.adapters.opacus._internals import unwrap
from lastiter_plugins.adapters.opacus._loaders import check_data_loader
from lastiter_plugins.adapters.opacus._record import (
    core_batch,
    optimizer_normaliser,
    planned_normaliser,
)
from lastiter_plugins.config import poisson_batch_size

_Error = LastIterateConfigurationError
_Changed = LastIteratePipelineChangedError


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
        self._adopt(
            caller["module"],
            optim,
            optim.max_grad_norm,
            core_batch(reg.dataset_size, facts),
            optimizer_normaliser(optim),
        )
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
                linear, clip = find_structure(model, self.decl)
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
        batch, normaliser = core_batch(self.declared.dataset_size, self._facts), optimizer_normaliser(optim)
        try:
            self._adopt(module, optim, optim.max_grad_norm, batch, normaliser)
        except _Error as exc:
            raise _Changed(str(exc)) from None

    def before_epsilon(self, steps: int) -> None:
        """Opacus' calibration (a history without steps) derives from its call."""
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
            b = core_batch(reg.dataset_size, check_data_loader(loader, reg.sampling, reg.dataset_size))
        normaliser = planned_normaliser(call["loss_reduction"], n, 1.0 / batches)
        # Opacus' calibration runs on a temporary accountant: derive without hooking the model
        self._adopt(call["module"], call["optimizer"], call["max_grad_norm"], b, normaliser, watch=False)

    def before_load(self) -> None:
        if self.derivation is None:
            raise _Error(
                "model='glm' derives the loss assumptions from the model: call make_private before loading the "
                "accountant's state, so that the checkpoint's constants can be compared with the model's."
            )
