"""The run checks of the Opacus adapter, one file each: what each observes at every step, and the rows it
gates (``base``: the protocol; the run, ``_run.py``, holds them in the order of docs/opacus.md, *Verified at
every step*)."""

from lastiter_plugins.adapters.opacus._checks.allocation import DrawnAllocation
from lastiter_plugins.adapters.opacus._checks.base import EVERY_ROW, Check, Step
from lastiter_plugins.adapters.opacus._checks.batches import DrawnBatches
from lastiter_plugins.adapters.opacus._checks.buffers import DATA_INDEPENDENT_BUFFERS, FrozenBuffers, tracked_buffers
from lastiter_plugins.adapters.opacus._checks.examples import OneGradientPerExample
from lastiter_plugins.adapters.opacus._checks.generators import SamplingGenerator, refuse_public_noise
from lastiter_plugins.adapters.opacus._checks.ghost import GhostBackward
from lastiter_plugins.adapters.opacus._checks.linear_route import LinearRoute
from lastiter_plugins.adapters.opacus._checks.loader import BoundLoader
from lastiter_plugins.adapters.opacus._checks.mechanism import ConstantMechanism, check_permutation
from lastiter_plugins.adapters.opacus._checks.metric_rules import MetricRules
from lastiter_plugins.adapters.opacus._checks.optimizer import BoundOptimizer
from lastiter_plugins.adapters.opacus._checks.per_layer import PerLayerClipping
from lastiter_plugins.adapters.opacus._checks.projection import DeclaredProjection
from lastiter_plugins.adapters.opacus._checks.update import PlainSgd
from lastiter_plugins.adapters.opacus._checks.within_clip import DeclaredWithinClip
from lastiter_plugins.adapters.opacus._checks.writes import AccountedWrites

__all__ = [
    "DATA_INDEPENDENT_BUFFERS",
    "EVERY_ROW",
    "AccountedWrites",
    "BoundLoader",
    "BoundOptimizer",
    "Check",
    "ConstantMechanism",
    "DeclaredProjection",
    "DeclaredWithinClip",
    "DrawnAllocation",
    "DrawnBatches",
    "FrozenBuffers",
    "GhostBackward",
    "LinearRoute",
    "MetricRules",
    "OneGradientPerExample",
    "PerLayerClipping",
    "PlainSgd",
    "SamplingGenerator",
    "Step",
    "check_permutation",
    "refuse_public_noise",
    "tracked_buffers",
]
