"""What a run check is: one fact of the run, observed at every step, and the rows it gates.

A check either gates *every row* (a fact every bound needs: the noise, the clipped sum's sensitivity, the
examples and batches the step used, the model changed only by the accounted steps): when it breaks, the
check raises :class:`~lastiter_plugins.adapters.opacus._errors.LastIteratePipelineChangedError` and the run
is void. Or it gates *the rows with a precondition*: when the fact breaks, the check returns a
:class:`lastiter_plugins.host.Departure` (the first step it could have affected, the fact in words, the
pipeline fields it weakens), which removes exactly those rows for the rest of the run (docs/opacus.md,
*What each check gates*).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from lastiter_plugins.host import Departure

if TYPE_CHECKING:
    from lastiter_plugins.adapters._derivation import DrawnBatch
    from lastiter_plugins.adapters.opacus._declaration import Registration
    from lastiter_plugins.adapters.opacus._record import Observed
    from lastiter_plugins.adapters.opacus._run import Run

#: :attr:`Check.gates` of a check whose fact every row needs
EVERY_ROW = "every row"


@dataclasses.dataclass(slots=True)
class Step:
    """One step as the checks see it (discarded after the step; the ledger keeps a ``StepRecord``).

    Attributes:
      number: the step being accounted (1-based).
      optim: the DP optimizer taking it.
      run: the binding it belongs to (its loader, module, registration, ledger).
      observed: the mechanism, validated (set by the run before the checks).
      unchanged: every optimizer value the mechanism and the update were read from equals the previous
        step's (immutable values only): checks of those values may skip this step.
      gradients: the per-example clipped gradients the step sums (set by the examples check).
      batch: the batch the step used, as its sampler drew it (set by the batches check).
      rows: the fingerprints of the rows the step's training forwards received (set by the examples check),
        which the batch check matches with the delivered batches.
    """

    number: int
    optim: Any
    run: Run
    observed: Observed
    unchanged: bool
    gradients: int | None = None
    batch: DrawnBatch | None = None
    rows: tuple = ()

    @property
    def registration(self) -> Registration:
        return self.run.registration


class Check:
    """One fact of the run, checked at every step: returns a departure, or raises for a fact every row needs."""

    #: the rows it gates: :data:`EVERY_ROW`, or the pipeline fields its departures weaken
    gates: ClassVar[str] = EVERY_ROW

    def at_step(self, step: Step) -> Departure | None:
        raise NotImplementedError

    def remove(self) -> None:
        """Remove the hooks it holds (the run is re-bound or ends)."""
