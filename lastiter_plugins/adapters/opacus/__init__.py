r"""Last-iterate accountants behind Opacus' ``PrivacyEngine(accountant=...)``.

Tested against Opacus 1.5.x and 1.6.x (torch 2.13); other versions are refused
(``lastiter_plugins.UnsupportedHostError``). Usage::

    from lastiter_plugins.adapters import opacus as lastiter_opacus

    lastiter_opacus.register("last-iterate", sampling="cyclic", dataset_size=len(dataset),
                             learning_rate=0.1, smoothness=1.0)
    engine = PrivacyEngine(accountant="last-iterate")  # Opacus 1.5: attach(PrivacyEngine(), "last-iterate")
    model, optimizer, loader = engine.make_private(..., poisson_sampling=False)  # DataLoader(shuffle=False)
    ...train...
    engine.get_epsilon(delta)            # final model only, replace-one neighbours
    print(engine.accountant.report(delta))

The accountant observes the run that actually happens, at every optimizer step (docs/opacus.md), and
gives it the core's number for what ran: a fact that breaks a row's precondition (Adam, momentum, a
learning-rate schedule, per-layer clipping, ...) removes that row from ``best`` (``report`` says which,
when and why); a fact every row needs (the loader, the examples, the noise and clipping, the parameters
written only by the accounted steps) refuses the run with ``lastiter_plugins.PipelineChangedError``.

Opacus 1.5 has no accountant registry: ``PrivacyEngine(accountant=name)`` refuses
the name there, so use ``attach(PrivacyEngine(), name)`` (or ``engine.accountant =
create_accountant(name)``) before ``make_private``; ``make_private_with_epsilon``
needs Opacus 1.6 (``docs/opacus.md``, *Opacus 1.5*).

Modules (each one job; docs/layout.md): ``_registration`` (the public entry points), ``_accountant`` (the
ledger), ``_binding`` and ``_run`` (one run and its checks), ``_checks/`` (one run check per file),
``_record`` (the mechanism observed), ``_loaders``, ``_patches`` (every patch of torch and Opacus),
``_internals`` (every read of Opacus' private state), ``_checkpoint``, ``_calibration``, ``_start``,
``_report``, ``_projection`` and the certified linear route (``_glm*``).
"""

from __future__ import annotations

try:  # the host library is optional for the package, required for this module
    import opacus  # noqa: F401
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lastiter_plugins.adapters.opacus needs torch and opacus: pip install 'lastiter-plugins[opacus]'"
    ) from exc

from lastiter_plugins.adapters.opacus._accountant import LastIterateAccountant
from lastiter_plugins.adapters.opacus._allocation_sampler import RandomAllocationSampler
from lastiter_plugins.adapters.opacus._checks import DATA_INDEPENDENT_BUFFERS
from lastiter_plugins.adapters.opacus._checks.examples import ExampleCounter as _ExampleCounter
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError, LastIteratePipelineChangedError
from lastiter_plugins.adapters.opacus._glm_clip import FeatureNormClip
from lastiter_plugins.adapters.opacus._internals import TESTED_OPACUS
from lastiter_plugins.adapters.opacus._loaders import (
    LoaderFacts,
    ShuffleOnceSampler,
    check_data_loader,
    describe_data_loader,
)
from lastiter_plugins.adapters.opacus._patches import TESTED_TORCH
from lastiter_plugins.adapters.opacus._projection import Projection, attach_projection
from lastiter_plugins.adapters.opacus._registration import attach, create_accountant, register, registration
from lastiter_plugins.adapters.opacus._report import THREAT_MODEL, Report, ReportRow

__all__ = [
    "DATA_INDEPENDENT_BUFFERS",
    "TESTED_OPACUS",
    "TESTED_TORCH",
    "THREAT_MODEL",
    "FeatureNormClip",
    "LastIterateAccountant",
    "LastIterateConfigurationError",
    "LastIteratePipelineChangedError",
    "LoaderFacts",
    "Projection",
    "RandomAllocationSampler",
    "Registration",
    "Report",
    "ReportRow",
    "ShuffleOnceSampler",
    "attach",
    "attach_projection",
    "check_data_loader",
    "create_accountant",
    "describe_data_loader",
    "register",
    "registration",
]
_ = _ExampleCounter  # kept importable for tests of the counter
