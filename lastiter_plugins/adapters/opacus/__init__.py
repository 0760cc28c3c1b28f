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
projection ball when a diameter is declared) and the module's buffers (unchanged;
after ``load_state_dict``, the model the state was saved with). A mismatch raises
``lastiter_plugins.PipelineChangedError`` and voids the run's epsilon.

Opacus 1.5 has no accountant registry: ``PrivacyEngine(accountant=name)`` refuses
the name there, so use ``attach(PrivacyEngine(), name)`` (or ``engine.accountant =
create_accountant(name)``) before ``make_private``; ``make_private_with_epsilon``
needs Opacus 1.6 (``docs/opacus.md``, *Opacus 1.5*).

Modules of this package (each one job): ``_registration`` (register, create_accountant, attach,
errors), ``_loaders`` (loader -> sampling scheme, per-step loader watch), ``_observe`` (optimizer
facts in the core's terms, N and b, example counter), ``_monitor`` (the run monitor: the batches
each step drew, the model's earlier accounting, loss-reading schedulers; the derivation is
``lastiter_plugins.adapters._derivation``, shared), ``_steps`` (per-step optimizer, example and model
checks), ``_projection``, ``_report``, ``_accountant``, the certified linear models of
``register(..., model="glm")`` (``_glm_clip``: ``FeatureNormClip``; ``_glm_declaration``: the declared
loss; ``_glm_derive``: the model's structure and the derived constants; ``_glm_watch``: the
per-forward and per-step checks; ``_glm``: the route the accountant holds) and
``_internals`` (the only reader of Opacus' private state, behind a version guard).
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
