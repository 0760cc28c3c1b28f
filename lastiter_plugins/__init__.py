r"""lastiter-plugins: last-iterate privacy accountants for DP-SGD.

Every epsilon computed here protects the FINAL model only (except the
``composition`` baseline, which certifies every iterate): intermediate
checkpoints must not be released. See README.md and docs/.

The public names below are imported on first use (PEP 562), so that importing
the package, and ``lastiter --help``, do not load numpy, scipy and dp-accounting.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The package version; the only place it is written (pyproject.toml reads it from here).
__version__ = "0.3.0"

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Suggestion", "advise", "baseline_note", "is_standard_baseline"), "advice"),
    **dict.fromkeys(("PARAMETERS", "Parameters", "applicable_bounds", "build", "epsilon", "rdp"), "api"),
    **dict.fromkeys(("CalibrationResult", "calibrate_noise"), "calibration"),
    **dict.fromkeys(("LossAssumptions", "Relation", "Sampling", "TrainingConfig", "Update"), "config"),
    "OrderGridWarning": "conversion",
    "DEFAULT_ORDERS": "validation",
    **dict.fromkeys(
        (
            "CalibrationError",
            "ImpossibleDeclarationWarning",
            "NotApplicableError",
            "PipelineChangedError",
            "UnsupportedHostError",
        ),
        "errors",
    ),
    "impossible_declaration": "feasibility",
    **dict.fromkeys(("Answer", "HostNumber", "answer_lines"), "summary"),
    **dict.fromkeys(("BoundEvaluation", "EpsilonResult", "UnprovenBoundWarning"), "evaluation"),
    **dict.fromkeys(("BEST", "BOUND_IDS", "BOUNDS", "BoundSpec", "Kind", "Proof", "Protects"), "registry"),
}

#: Names of 0.2 that overlapped another (compute_epsilon, compute_rdp, evaluate_all, advise_config): still
#: reachable as lastiter_plugins.NAME, with a DeprecationWarning naming the replacement; removed at 1.0.
_DEPRECATED = ("advise_config", "compute_epsilon", "compute_rdp", "evaluate_all")

# what `from lastiter_plugins import *` gives; the keys of _EXPORTS (docs/api.md; tests/core/test_cli.py checks)
__all__ = [
    "BEST",
    "BOUNDS",
    "BOUND_IDS",
    "DEFAULT_ORDERS",
    "PARAMETERS",
    "Answer",
    "BoundEvaluation",
    "BoundSpec",
    "CalibrationError",
    "CalibrationResult",
    "EpsilonResult",
    "HostNumber",
    "ImpossibleDeclarationWarning",
    "Kind",
    "LossAssumptions",
    "NotApplicableError",
    "OrderGridWarning",
    "Parameters",
    "PipelineChangedError",
    "Proof",
    "Protects",
    "Relation",
    "Sampling",
    "Suggestion",
    "TrainingConfig",
    "UnprovenBoundWarning",
    "UnsupportedHostError",
    "Update",
    "advise",
    "answer_lines",
    "applicable_bounds",
    "baseline_note",
    "build",
    "calibrate_noise",
    "epsilon",
    "impossible_declaration",
    "is_standard_baseline",
    "rdp",
]


def __getattr__(name: str) -> Any:
    """A public name (imported from its module on first use), or a submodule (``lp.profiles``)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    if name in _DEPRECATED:  # not cached: every access warns
        return importlib.import_module(f"{__name__}._deprecated").warned(name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":  # the submodule exists but an import inside it failed
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:  # what type checkers and IDEs see: the eager imports
    from lastiter_plugins._deprecated import advise_config as advise_config  # deprecated (removed in 1.0)
    from lastiter_plugins._deprecated import compute_epsilon as compute_epsilon
    from lastiter_plugins._deprecated import compute_rdp as compute_rdp
    from lastiter_plugins._deprecated import evaluate_all as evaluate_all
    from lastiter_plugins.advice import Suggestion, advise, baseline_note, is_standard_baseline
    from lastiter_plugins.api import PARAMETERS, Parameters, applicable_bounds, build, epsilon, rdp
    from lastiter_plugins.calibration import CalibrationResult, calibrate_noise
    from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, Update
    from lastiter_plugins.conversion import OrderGridWarning
    from lastiter_plugins.errors import (
        CalibrationError,
        NotApplicableError,
        PipelineChangedError,
        UnsupportedHostError,
    )
    from lastiter_plugins.evaluation import BoundEvaluation, EpsilonResult, UnprovenBoundWarning
    from lastiter_plugins.registry import BEST, BOUND_IDS, BOUNDS, BoundSpec, Kind, Proof, Protects
    from lastiter_plugins.validation import DEFAULT_ORDERS
