r"""What a run check is: one fact of the run, a precondition of named rows, watched before the first step and
at every step.

What a check finds either holds, or weakens the pipeline (a :class:`lastiter_plugins.host.Departure`: from that
step on, the rows whose preconditions it breaks leave ``best``; the core says which), or breaks every row (the
run is refused: before the first step by raising ``AccountingError``, later by returning the reason, which voids
the epsilon). ``Check.gates`` is the weakening its departures apply, so ``Check.rows`` names the rows it gates for
a pipeline; a check with no ``gates`` watches a precondition of every row. The ledger (:mod:`.._run`) calls every
check at every point below; a check answers only where it has something to say (the defaults hold).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from lastiter_plugins import LossAssumptions, TrainingConfig
from lastiter_plugins.host import Departure, rows_removed

from .._observe import HostFacts, StepFacts
from .._settings import DPOptimizerSettings, FitSettings

#: What a check says at a point of the run: nothing to say (None), a departure, or a refusal (the reason).
Verdict = Departure | str | None


def weakening(**changes: Any) -> Mapping[str, Any]:
    """A check's ``gates``: the pipeline fields its departures weaken, each to its weak value (read-only)."""
    return types.MappingProxyType(changes)


#: Appended to a refusal found during training.
VOID = "; the epsilon of this run is void."


@dataclasses.dataclass(frozen=True)
class Start:
    """What the checks see before the first step (read once).

    Attributes:
      model: the Keras model fit trains.
      optimizer: the DP optimizer's mechanism.
      fit: what fit does with the data.
      config: the run as declared and planned (the SGD update at the optimizer's rate at step 0, every planned
        step); the checks' departures weaken it.
      assumptions: the loss assumptions (declared, or derived on the linear-model route).
      dataset_size: the number of examples the user declared.
      earlier_steps: the steps an earlier accounted fit took on this model (None: none).
      keras_steps_before: the training steps Keras counted on the model before this fit (any fit or
        ``train_on_batch`` of this process, accounted or not).
      metric_source: ``"public"`` when the user declared that every rule reading a metric during training (a
        learning-rate rule, a stopping rule) reads data outside the private set or the released iterates only;
        None otherwise.
      public_statistics: the user declared that the state ``adapt`` fitted in the model's preprocessing layers
        was computed from public data only.
      public_pretraining: the user declared that any training of the model before this fit (in this process, or
        by the optimizer's earlier steps) used public data only.
    """

    model: Any
    optimizer: DPOptimizerSettings
    fit: FitSettings
    config: TrainingConfig
    assumptions: LossAssumptions
    dataset_size: int
    earlier_steps: int | None
    keras_steps_before: int
    metric_source: str | None
    public_statistics: bool = False
    public_pretraining: bool = False


class Check:
    """A run check (see the module's docstring). Subclasses override the points where they watch something."""

    #: The weakening its departures apply (host.Departure's changes); empty: it refuses the run only.
    gates: ClassVar[Mapping[str, Any]] = weakening()
    #: Set by a check (before or during training) when the epsilon must cover every planned step, not only
    #: the steps run (training may stop at a time chosen during the run).
    planned_steps: bool = False

    def start(self, start: Start) -> Iterable[Departure]:
        """Before the first step: the departures known now (step 1); raises AccountingError when every row breaks."""
        return ()

    def install(self, start: Start) -> None:
        """Instrument the host for the run, once every check started and the step probe is in place (a check's
        own probe wraps the step probe's wrappers)."""

    def read(self, steps: int) -> str | None:
        """Read what the check recorded itself since the last check (``steps``: the steps the step table holds)."""
        return None

    def step(self, k: int, facts: StepFacts) -> Verdict:
        """Step ``k`` (1-based), as its compiled step recorded it."""
        return None

    def host(self, facts: HostFacts, checked: int) -> Verdict:
        """What the compiled step cannot see, after step ``checked``."""
        return None

    def epoch_end(self, steps: int, stopped: bool) -> Verdict:
        """At the end of an epoch, after ``steps`` steps in all; ``stopped``: model.stop_training is set."""
        return None

    def train_end(self, steps: int, stopped: bool) -> Verdict:
        """At the end of fit."""
        return None

    def when_read(self, model: Any, steps: int, moved: tuple[float, bool] | None) -> str | None:
        """When the epsilon is read: whether the model is still what the ``steps`` counted steps made (``moved``:
        once training ended, the trainable weights' distance from the last step's end, projected with a
        projection, and whether a non-trainable weight changed; None before the end)."""
        return None

    def remove(self) -> None:
        """Remove what the check installed in the host (at the end of fit or when the run is void)."""

    def rows(
        self, config: TrainingConfig, assumptions: LossAssumptions, published_only: bool = False
    ) -> tuple[str, ...]:
        """The rows of ``best``'s candidates for the pipeline that this check's departures remove."""
        return rows_removed(self.gates, config, assumptions, published_only) if self.gates else ()
