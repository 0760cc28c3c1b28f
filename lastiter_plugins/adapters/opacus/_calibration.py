"""The declared pipeline of the steps so far, and Opacus' calibration (``make_private_with_epsilon``): the run
it plans, read from its call before any optimizer step (it sets the accountant's history without running the
optimizer), and the plan's check at the first step."""

from __future__ import annotations

import math
from typing import Any

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._binding import departures_at_start
from lastiter_plugins.adapters.opacus._checkpoint import check_loaded_model
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError, LastIteratePipelineChangedError
from lastiter_plugins.adapters.opacus._loaders import FIXES, LoaderFacts, check_data_loader
from lastiter_plugins.adapters.opacus._record import (
    Observed,
    check_clip,
    core_assumptions,
    core_batch,
    core_learning_rate,
    pipeline,
    planned_normaliser,
)

Sampling = lp.Sampling


def declared_config(accountant: Any) -> lp.TrainingConfig | None:
    """The declared pipeline of the steps so far, before the departures (None before any step). When an epsilon
    is read: nothing changed the model since the last step (else the run is void), and the declared domain held
    after it (else a departure)."""
    if accountant.glm is not None:
        accountant.glm.before_epsilon(len(accountant.history))
    if accountant.void is not None:
        raise LastIteratePipelineChangedError(accountant.void_message())
    if not accountant.history:
        return None
    reg, noise = accountant.registration, history_noise(accountant.history)
    observed, steps, run = accountant.observed, accountant.steps, accountant.run
    if observed is None:  # Opacus' calibration: a history, no optimizer step
        observed, steps = planned_run(accountant)
    elif run is not None and accountant.resume_digest is None:
        try:
            released = run.at_release(steps)
        except LastIteratePipelineChangedError as exc:
            accountant.void = str(exc)
            raise LastIteratePipelineChangedError(accountant.void_message()) from None
        if released is not None:
            accountant.depart(released, observed, steps)
    check_loaded_model(accountant)
    return pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, steps).replace(noise_multiplier=noise)


def history_noise(history: list) -> float:
    """The one noise multiplier of a history (Opacus' format), or refuse."""
    noises = {entry[0] for entry in history}
    rates = {entry[1] for entry in history}
    if len(noises) > 1 or len(rates) > 1:
        raise LastIterateConfigurationError(
            "noise_multiplier and sample_rate must be constant over the run for every row of this library. "
            f"Found noise multipliers {sorted(noises)} and sample rates {sorted(rates)} in the history."
        )
    return float(next(iter(noises)))


def planned_run(accountant: Any) -> tuple[Observed, int]:
    """What the run will do, before any step, from the running make_private_with_epsilon call (Opacus'
    calibration sets the accountant's history without running the optimizer): its mechanism and its steps;
    the departures its optimizer shows (Adam, ...) are recorded on the accountant."""
    reg = accountant.registration
    call = internals.engine_locals("make_private_with_epsilon", depth=16)
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
    clip = call["max_grad_norm"]
    check_clip(clip)
    if call.get("clipping", "flat") != "flat":
        raise LastIterateConfigurationError(
            f"make_private_with_epsilon with clipping={call.get('clipping')!r} must be calibrated by "
            "lastiter_plugins.calibrate_noise: the accountant plans flat clipping. Found another clipping."
        )
    sample_rate = facts.opacus_sample_rate
    # make_private: expected_batch_size = int(n * sample_rate) in total over the workers
    normaliser = planned_normaliser(call["loss_reduction"], reg.dataset_size, sample_rate)
    b = core_batch(reg.dataset_size, facts)
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
        learning_rate=core_learning_rate(reg.learning_rate, b, normaliser),
        allocations_per_epoch=facts.allocations_per_epoch,
    )
    accountant.departures = departures_at_start(reg, _Planned(call["optimizer"]))
    if not math.isclose(accountant.history[0][1], sample_rate, rel_tol=1e-12):
        raise LastIterateConfigurationError(
            f"sample_rate must be 1/len(data_loader) = {sample_rate:g}. Found {accountant.history[0][1]:g}."
        )
    # Opacus computes steps = int(epochs / sample_rate), which can round down by one
    return observed, max(accountant.steps, int(call["epochs"]) * facts.num_batches)


class _Planned:
    """The torch optimizer of a planned run, as the DP optimizer make_private will wrap it (flat clipping)."""

    def __init__(self, optimizer: Any) -> None:
        self.original_optimizer = optimizer


def check_plan(accountant: Any, observed: Observed, plan: tuple[float, float, int]) -> None:
    """The run make_private_with_epsilon calibrated for must still reach its target (at the first step)."""
    target_epsilon, target_delta, epochs = plan
    reg = accountant.registration
    steps = epochs * observed.loader_batches
    config = pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, steps)
    assumptions = core_assumptions(reg, observed)
    eps = host.account(reg.declaration(), config, assumptions, target_delta, accountant.departures).result.epsilon
    if eps > target_epsilon:
        raise LastIterateConfigurationError(
            f"epsilon after the planned {epochs} epochs must be <= target_epsilon = {target_epsilon:g} as "
            f"make_private_with_epsilon calibrated, but the run observed at the first step (batch_size="
            f"{observed.batch_size}, {steps} steps) would give epsilon = {eps:.6g}. Calibrate with "
            "lastiter_plugins.calibrate_noise and call make_private instead."
        )
