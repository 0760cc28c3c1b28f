"""Opacus' calibration (``make_private_with_epsilon``): the run it plans, read from its call before any
optimizer step (it sets the accountant's history without running the optimizer)."""

from __future__ import annotations

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._loaders import FIXES, LoaderFacts, check_data_loader
from lastiter_plugins.adapters.opacus._observe import (
    Observed,
    check_clip,
    check_sgd,
    core_batch,
    planned_normaliser,
)
from lastiter_plugins.adapters.opacus._registration import LastIterateConfigurationError, Registration

Sampling = lp.Sampling


def planned_run(reg: Registration) -> tuple[Observed, int]:
    """What the run will do, before any step, from the running make_private_with_epsilon call (Opacus'
    calibration sets the accountant's history without running the optimizer): its facts, and its steps."""
    call = internals.engine_locals("make_private_with_epsilon")
    if call is None:
        raise LastIterateConfigurationError(
            f"accountant {reg.name!r} has not seen an optimizer step, and this call does not come from "
            "PrivacyEngine.make_private_with_epsilon, so the batch size, clipping norm and loss reduction are "
            "unknown. Train first, or calibrate with lastiter_plugins.calibrate_noise(...)."
        )
    loader = call["data_loader"]
    if call["poisson_sampling"]:  # make_private will replace the loader by a Poisson one with q = 1/len(loader)
        if reg.sampling is not Sampling.POISSON:
            raise LastIterateConfigurationError(
                f"sampling was declared {reg.sampling.value!r} but "
                "make_private_with_epsilon(poisson_sampling=True) replaces the data loader by a Poisson one. "
                "Pass poisson_sampling=False with "
                f"{FIXES[reg.sampling]}, or register with sampling='poisson'."
            )
        n = len(loader.dataset)
        if n != reg.dataset_size:
            raise LastIterateConfigurationError(
                f"dataset_size must equal len(data_loader.dataset) = {n}. Found {reg.dataset_size} registered."
            )
        facts = LoaderFacts(Sampling.POISSON, n, len(loader), None, 1.0 / len(loader), False, "Poisson (planned)")
    else:
        facts = check_data_loader(loader, reg.sampling, reg.dataset_size)
    check_sgd(call["optimizer"], reg)
    clip = call["max_grad_norm"]
    check_clip(clip)
    sample_rate = facts.opacus_sample_rate
    # make_private: expected_batch_size = int(n * sample_rate) in total over the workers
    normaliser = planned_normaliser(call["loss_reduction"], reg.dataset_size, sample_rate)
    b = core_batch(reg, facts)
    observed = Observed(
        noise_multiplier=1.0,
        clip_norm=float(clip),
        loss_reduction=call["loss_reduction"],
        normaliser=normaliser,
        accumulated_iterations=1,
        sampling=facts.sampling.value,
        loader_batches=facts.num_batches,
        loader_batch_size=facts.batch_size,
        sample_rate=sample_rate,
        batch_size=b,
        learning_rate=reg.learning_rate * b / normaliser,
    )
    return observed, int(call["epochs"]) * facts.num_batches
