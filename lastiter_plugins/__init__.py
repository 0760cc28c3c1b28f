r"""lastiter-plugins: last-iterate privacy accountants for DP-SGD.

Every epsilon computed here protects the FINAL model only (except the
``composition`` baseline, which certifies every iterate): intermediate
checkpoints must not be released. See README.md and docs/.
"""

from lastiter_plugins.advice import Suggestion, advise, advise_config, baseline_note, is_standard_baseline
from lastiter_plugins.api import (
    PARAMETERS,
    Parameters,
    applicable_bounds,
    build,
    compute_epsilon,
    compute_rdp,
    epsilon,
    rdp,
)
from lastiter_plugins.calibration import calibrate_noise
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.conversion import OrderGridWarning
from lastiter_plugins.errors import CalibrationError, NotApplicableError, PipelineChangedError, UnsupportedHostError
from lastiter_plugins.evaluation import BoundEvaluation, EpsilonResult, evaluate_all
from lastiter_plugins.registry import BEST, BOUND_IDS, BOUNDS, BoundSpec, Kind, Proof, Protects
from lastiter_plugins.validation import DEFAULT_ORDERS

#: The package version; the only place it is written (pyproject.toml reads it from here).
__version__ = "0.2.0"

__all__ = [
    "BEST",
    "BOUNDS",
    "BOUND_IDS",
    "DEFAULT_ORDERS",
    "PARAMETERS",
    "BoundEvaluation",
    "BoundSpec",
    "CalibrationError",
    "EpsilonResult",
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
    "UnsupportedHostError",
    "advise",
    "advise_config",
    "applicable_bounds",
    "baseline_note",
    "build",
    "calibrate_noise",
    "compute_epsilon",
    "compute_rdp",
    "epsilon",
    "evaluate_all",
    "is_standard_baseline",
    "rdp",
]
