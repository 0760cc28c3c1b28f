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

The accountant verifies the run that actually happens, at every optimizer step
(docs/opacus.md): the loader bound at ``make_private`` (same dataset and size,
same sampler), one whole loader batch per step with one clipped gradient per
example, the optimizer (plain SGD at the registered step size, constant noise and
clipping norm), the parameters (changed only by the accounted steps; inside the
projection ball when a diameter is declared). A mismatch raises
``lastiter_plugins.PipelineChangedError`` and voids the run's epsilon.

Opacus 1.5 has no accountant registry: ``PrivacyEngine(accountant=name)`` refuses
the name there, so use ``attach(PrivacyEngine(), name)`` (or ``engine.accountant =
create_accountant(name)``) before ``make_private``; ``make_private_with_epsilon``
needs Opacus 1.6 (``docs/opacus.md``, *Opacus 1.5*).

Modules (each one job): ``_opacus_registration`` (register, create_accountant, attach, errors),
``_opacus_loaders`` (loader -> sampling scheme, per-step loader watch),
``_opacus_observe`` (optimizer facts in the core's terms, example counter),
``_opacus_steps`` (per-step data and parameter checks), ``_opacus_projection``,
``_opacus_report``, ``_opacus_accountant``, ``_opacus_glm`` (certified linear models:
``register(..., model="glm")`` and ``FeatureNormClip``) and ``_opacus_internals`` (the only
reader of Opacus' private state, behind a version guard).
"""

from __future__ import annotations

try:  # the host library is optional for the package, required for this module
    import opacus  # noqa: F401
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lastiter_plugins.adapters.opacus needs torch and opacus: pip install 'lastiter-plugins[opacus]'"
    ) from exc

from lastiter_plugins.adapters._opacus_accountant import LastIterateAccountant
from lastiter_plugins.adapters._opacus_glm import FeatureNormClip, GlmAccountant
from lastiter_plugins.adapters._opacus_internals import TESTED_OPACUS
from lastiter_plugins.adapters._opacus_loaders import (
    LoaderFacts,
    ShuffleOnceSampler,
    check_data_loader,
    describe_data_loader,
)
from lastiter_plugins.adapters._opacus_observe import ExampleCounter as _ExampleCounter
from lastiter_plugins.adapters._opacus_projection import Projection, attach_projection
from lastiter_plugins.adapters._opacus_registration import (
    LastIterateConfigurationError,
    LastIteratePipelineChangedError,
    Registration,
    attach,
    create_accountant,
    register,
    registration,
)
from lastiter_plugins.adapters._opacus_report import THREAT_MODEL, Report, ReportRow

__all__ = [
    "TESTED_OPACUS",
    "THREAT_MODEL",
    "FeatureNormClip",
    "GlmAccountant",
    "LastIterateAccountant",
    "LastIterateConfigurationError",
    "LastIteratePipelineChangedError",
    "LoaderFacts",
    "Projection",
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
