"""What ``make_private`` is checked against before any step: one model per engine, and the declaration not
already broken by the optimizer it was given (a named bound, or ``require="last_iterate"``, refused there,
with the departure that breaks it)."""

from __future__ import annotations

from typing import Any

from lastiter_plugins import host
from lastiter_plugins.adapters.opacus._checks.update import not_plain_sgd
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError as _Error
from lastiter_plugins.adapters.opacus._internals import unwrap
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts
from lastiter_plugins.adapters.opacus._record import CLIPPING, observe, pipeline, plain


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
    """Refuse at ``make_private`` a run whose named bound (or ``require``) the optimizer already breaks."""
    observed = observe(optim, reg.learning_rate, reg.dataset_size, facts)
    config = pipeline(reg.dataset_size, reg.sampling, reg.relation, observed, 1)
    why = host.refusal(reg.declaration(), config, reg.assumptions, departures_at_start(reg, optim))
    if why is not None:
        raise _Error(f"{why} Register bound='best' (without require) to keep the rows that still apply.")
