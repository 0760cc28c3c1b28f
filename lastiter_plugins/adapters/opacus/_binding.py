"""Binding an accountant to a run: at ``make_private`` (read from its call) or ``bind_data_loader``.

What ``make_private`` is checked against before any step: the loader against the declaration, one model per
engine, and the declaration not already broken by the optimizer it was given (a named bound, or
``require="last_iterate"``, refused there, with the departure that breaks it). Then a new :class:`Run`
replaces the previous one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._checkpoint import check_permutation
from lastiter_plugins.adapters.opacus._checks.generators import refuse_public_noise
from lastiter_plugins.adapters.opacus._checks.update import not_plain_sgd
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError as _Error
from lastiter_plugins.adapters.opacus._internals import unwrap
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts, check_data_loader
from lastiter_plugins.adapters.opacus._record import CLIPPING, core_assumptions, observe, pipeline, plain
from lastiter_plugins.adapters.opacus._run import Run


def bind(accountant: Any, facts: LoaderFacts, loader: Any, module: Any, optim: Any = None, plan: Any = None) -> None:
    """A new run for ``accountant`` (continuing its index record after steps, or a checkpoint's)."""
    if accountant.resumed and accountant.observed is not None:
        check_permutation(accountant.registration, accountant.observed, facts)
    accountant.start.bind(accountant, module)
    previous = accountant.run
    derivation = previous.derivation if previous is not None and accountant.steps else None
    if previous is not None:
        previous.remove()
    declared = type(accountant)._registration
    accountant.run = Run(accountant, declared, accountant.glm, facts, loader, module, optim, plan, derivation)
    if accountant.saved_record is not None and not derivation:
        accountant.run.derivation.restore(accountant.saved_record)
    if accountant.steps == 0:
        accountant.void = None


def bind_data_loader(accountant: Any, loader: Any, module: Any, loss: Any) -> LoaderFacts:
    """``accountant.bind_data_loader``: a run without make_private (the optimizer is seen at the first step)."""
    if loss is not None and accountant.glm is None:
        raise _Error("loss is for accountants registered with model='glm'. Found a loss module without it.")
    if module is not None and not isinstance(module, torch.nn.Module):
        raise _Error(f"module must be a torch.nn.Module. Found {type(module).__name__}.")
    reg = accountant.registration
    facts = check_data_loader(loader, reg.sampling, reg.dataset_size)
    bind(accountant, facts, loader, module)
    if accountant.glm is not None:
        accountant.glm.bind(facts, module, loss)
    return facts


def at_make_private(accountant: Any, caller: dict[str, Any], sample_rate: float) -> None:
    """``get_optimizer_hook_fn`` called by Opacus' ``make_private`` (``caller``: its locals): check and bind."""
    refuse_second_model(accountant, caller.get("module"))
    if accountant.glm is not None:  # first derive the constants from the model
        accountant.glm.at_make_private(caller)
    reg, optim = accountant.registration, caller["optimizer"]
    refuse_public_noise(optim)
    facts = check_data_loader(caller["data_loader"], reg.sampling, reg.dataset_size)
    if not math.isclose(facts.opacus_sample_rate, sample_rate, rel_tol=1e-9):
        raise _Error(f"sample_rate must be {facts.opacus_sample_rate:g} for this data loader. Found {sample_rate:g}.")
    refuse_broken_declaration(reg, optim, facts)  # a bound named and already broken: refused here
    outer = internals.engine_locals("make_private_with_epsilon")
    plan = (
        None if outer is None else (float(outer["target_epsilon"]), float(outer["target_delta"]), int(outer["epochs"]))
    )
    module = caller.get("module")  # (make_private(wrap_model=False): a hooks object holding the model the loop calls)
    bind(accountant, facts, caller["data_loader"], module if isinstance(module, torch.nn.Module) else unwrap(module),
         optim, plan)  # fmt: skip


def refuse_second_model(accountant: Any, module: Any) -> None:
    """``make_private`` again on this accountant's engine, for another model while the first is alive: both
    optimizers would report their steps to this one accountant (one run each is what it counts)."""
    run = accountant.run
    bound = run.module() if run is not None and run.module is not None else None
    if bound is None or module is None or unwrap(bound) is unwrap(module):
        return
    raise _Error(
        f"make_private must be called once per PrivacyEngine: its accountant ({accountant.registration.name!r}) "
        "accounts the run of one model. Found a second make_private on the same engine for another model "
        f"({type(unwrap(module)).__name__}) while the first ({type(unwrap(bound)).__name__}) is still in use: "
        "both optimizers would report their steps to this accountant. Use one PrivacyEngine per model (and "
        "account for releasing both models together by composition)."
    )


def departures_at_start(reg: Registration, optim: Any) -> list[host.Departure]:
    """The departures the optimizer ``make_private`` prepared shows before its first step."""
    base = optim.original_optimizer
    why = not_plain_sgd(base, reg)
    if why is None and CLIPPING.get(type(optim)) == "per_layer" and not reg.assumptions.gradient_norms_within_clip:
        why = "per-layer clipping (clipping='per_layer') may be active"
    if why is not None:
        return [host.Departure(1, why, {"update": "any", "learning_rate": None})]
    rate = float(plain(base.param_groups[0]["lr"]))
    if reg.learning_rate is not None and rate != reg.learning_rate:
        return [host.Departure(1, f"lr={rate:g}, not the registered learning_rate", {"learning_rate": None})]
    return []


def refuse_broken_declaration(reg: Registration, optim: Any, facts: LoaderFacts) -> None:
    """Refuse at ``make_private`` declarations no loss meets (a real run has real losses; the clip norm is known
    here) and a run whose named bound (or ``require``) the optimizer already breaks."""
    observed = observe(optim, reg.learning_rate, reg.dataset_size, facts)
    config = pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, 1)
    assumptions = core_assumptions(reg, observed)
    impossible = lp.impossible_declaration(config, assumptions)
    if impossible is not None:
        raise _Error(f"{impossible}. Found them registered as {reg.name!r}.")
    why = host.refusal(reg.declaration(), config, assumptions, departures_at_start(reg, optim))
    if why is not None:
        raise _Error(f"{why} Register bound='best' (without require) to keep the rows that still apply.")
