"""The model structure and the derivation of the GLM route's constants: the final ``nn.Linear`` on the
output of a :class:`FeatureNormClip` (:func:`find_structure`), plain SGD, and the certificate of
:func:`lastiter_plugins.glm.certify_linear_model` for them (:func:`derive`, :class:`Derivation`)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import torch
from torch import nn

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._glm_clip import FeatureNormClip
from lastiter_plugins.adapters.opacus._glm_declaration import BY_HAND, LOSSES, GlmDeclaration
from lastiter_plugins.adapters.opacus._internals import unwrap
from lastiter_plugins.glm import LinearModelCertificate, LossFamily, certify_linear_model

_Error = LastIterateConfigurationError


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


def find_structure(model: nn.Module, decl: GlmDeclaration) -> tuple[nn.Linear, FeatureNormClip]:
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
            f"Found {type(base).__name__}: the last-iterate rows the constants are for analyse plain SGD only. Use "
            "torch.optim.SGD (momentum=0), or register without model='glm' (the every-iterate rows cover any "
            "optimizer)."
        )
    clipping = type(optimizer).__name__
    if hasattr(optimizer, "original_optimizer") and clipping not in ("DPOptimizer", "DistributedDPOptimizer"):
        raise _Error(
            "model='glm' derives the constants for flat clipping (the clipped gradient of a scalar GLM is the "
            f"gradient of a convex smooth loss). Found {clipping} (per-layer or ghost clipping). Use "
            "make_private(clipping='flat', grad_sample_mode='hooks'), or register without model='glm'."
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
    linear, clip = find_structure(model, decl)
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


def _number(value: Any) -> float:
    return float(value.item() if torch.is_tensor(value) else value)
