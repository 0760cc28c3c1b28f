r"""The run checks of the TF Privacy adapter, one fact of the run each (one file per check).

A check is a precondition of named rows (:class:`Check`, :mod:`._check`): what it finds holds, removes the rows
it gates from that step on (a ``Departure``), or refuses the run. :func:`checks` lists them in the order the
ledger asks them (the first refusal is the one reported). To add one: a file here with a :class:`Check`
subclass, its place in :func:`checks`, and its test in tests/adapters/tf_privacy/checks/.

| check | watches | gates |
|---|---|---|
| :class:`SamplingCheck` | the declared scheme and n against what fit does with the data | every row |
| :class:`OptimizerCheck` | the DP optimizer's update (Adam, Adagrad, momentum, Keras clipping) | the SGD rows |
| :class:`LearningRateCheck` | a schedule, a rate changed during fit | the SGD rows, the rows needing eta |
| :class:`AllocationCheck` | a RandomAllocationDataset's batches, as delivered, padded with weight 0 | every row |
| :class:`StepCheck` | each step is one planned DP-SGD step (batch, loss vector, clip, noise, weights) | every row |
| :class:`ModelCheck` | batch norm in training, adapted layers, stateful layers, custom training, the loss | every row |
| :class:`BatchCouplingCheck` | a probe: one example's output moved by another example of the batch | every row |
| :class:`ConstraintCheck` | Keras constraints on the trained weights | the SGD rows |
| :class:`ProjectionCheck` | the declared projection, the iterate between steps and after fit | every row |
| :class:`MetricRulesCheck` | rules reading a metric (early stopping, plateau, a stop) | the SGD rows |
| :class:`LinearModelCheck` | the certified linear model runs as certified (``model="glm"``) | the loss rows |
"""

from __future__ import annotations

from .. import _glm
from ._check import VOID, Check, Start, Verdict
from .allocation import AllocationCheck
from .batch_coupling import BatchCouplingCheck
from .learning_rate import LearningRateCheck
from .linear_model import LinearModelCheck
from .metric_rules import MetricRulesCheck
from .model import ConstraintCheck, ModelCheck
from .optimizer import OptimizerCheck
from .projection import ProjectionCheck
from .sampling import SamplingCheck
from .steps import StepCheck

__all__ = [
    "VOID",
    "AllocationCheck",
    "BatchCouplingCheck",
    "Check",
    "ConstraintCheck",
    "LearningRateCheck",
    "LinearModelCheck",
    "MetricRulesCheck",
    "ModelCheck",
    "OptimizerCheck",
    "ProjectionCheck",
    "SamplingCheck",
    "Start",
    "StepCheck",
    "Verdict",
    "checks",
]


def checks(glm: _glm.Structure | None) -> tuple[Check, ...]:
    """Fresh checks for one run, in the order the ledger asks them (``glm``: the certified linear model, if any)."""
    found: tuple[Check, ...] = (
        SamplingCheck(),
        OptimizerCheck(),
        AllocationCheck(),  # before the step check: a padding row gone wrong (nan) shows there as weights moved
        StepCheck(),
        ModelCheck(),
        BatchCouplingCheck(),
        ConstraintCheck(),
        ProjectionCheck(),
        MetricRulesCheck(),
        LearningRateCheck(),
    )
    return found if glm is None else (*found, LinearModelCheck(glm))
