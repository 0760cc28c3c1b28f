r"""The sampling: the declared scheme must be what fit does with the order of the examples, read from fit's
data adapter (in-memory inputs) or the tf.data pipeline's transformations, over the declared number of
examples. Every row is proven for named schemes: a contradiction is refused before the first step."""

from __future__ import annotations

from collections.abc import Iterable

from lastiter_plugins import BOUNDS, Relation, Sampling
from lastiter_plugins.host import Departure

from .. import _observe as observe
from .._errors import AccountingError
from .._settings import FitSettings
from ._check import Check, Start

#: The samplings that describe what fit does with the order (``FitSettings.order``): a new uniform permutation
#: every epoch is reshuffling; a fixed order is cyclic, or shuffle_once when the user permuted the data once, at
#: random and in secret, before fit; one secret uniform permutation kept for every epoch (a tf.data shuffle
#: without reshuffling) is shuffle_once, and cyclic too (the cyclic rows hold for every fixed order, hence for a
#: random one). Fixed batches in a shuffled order (``fit(shuffle="batch")`` on arrays) is none of the covered
#: schemes.
SAMPLINGS_FOR_ORDER: dict[str, tuple[Sampling, ...]] = {
    observe.PERMUTATION: (Sampling.RESHUFFLE,),
    observe.FIXED: (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE),
    observe.ONCE: (Sampling.SHUFFLE_ONCE, Sampling.CYCLIC),
    observe.BATCH_ORDER: (),
    observe.ALLOCATION: (Sampling.RANDOM_ALLOCATION,),
}


class SamplingCheck(Check):
    def start(self, start: Start) -> Iterable[Departure]:
        declared = start.dataset_size
        if start.fit.dataset_size != declared:
            raise AccountingError(
                f"dataset_size must equal the number of examples fit trains on = {start.fit.dataset_size} "
                f"(after validation_split). Found dataset_size={declared}."
            )
        check_sampling(start.config.sampling, start.fit, start.config.relation)
        return ()


def check_sampling(declared: Sampling, fit: FitSettings, relation: Relation) -> None:
    """The declared sampling must describe what fit does with the order of the examples.

    A fixed order (fit(shuffle=False)) declared as ``reshuffle`` is accepted only when every bound the
    registry proves for reshuffling is also proven for a fixed order (cyclic) under ``relation``: such a
    bound holds for every order of the data, the fixed one included."""
    shown = f"fit(shuffle={fit.shuffle!r})" if fit.source == "arrays" else f"{fit.source} ({fit.shuffle})"
    if fit.order == observe.BATCH_ORDER:
        raise AccountingError(
            "fit's shuffle must be True (a new permutation every epoch: sampling='reshuffle') or False (the "
            "same order every epoch: sampling='cyclic'). shuffle='batch' keeps the batches and shuffles their "
            "order (and the rows within each batch), which is none of the schemes the bounds cover: not "
            "reshuffling (the batches never change) and not a fixed order. Found shuffle='batch'."
        )
    allowed = SAMPLINGS_FOR_ORDER[fit.order]
    fixed = fit.order in (observe.FIXED, observe.ONCE)
    if declared in allowed or (fixed and declared is Sampling.RESHUFFLE and reshuffle_covers_fixed(relation)):
        return
    if fixed and declared is Sampling.RESHUFFLE:
        only = ", ".join(reshuffle_only_bounds(relation))
        raise AccountingError(
            f"sampling must be {' or '.join(s.value for s in allowed)} for {shown}, which keeps the same order "
            "every epoch: "
            f"sampling=reshuffle is not accepted for a fixed order because {only} is proven only for a fresh "
            "secret permutation every epoch, whose randomness a fixed order lacks. Declare sampling='cyclic' "
            "(or shuffle the data: fit(shuffle=True)). Found sampling=reshuffle."
        )
    what = {
        observe.FIXED: "keeps the same order every epoch",
        observe.ONCE: "draws one uniform permutation in the first epoch and keeps it",
        observe.ALLOCATION: "draws a fresh random allocation every epoch",
    }.get(fit.order, "draws a new uniform permutation every epoch")
    if declared is Sampling.RANDOM_ALLOCATION:
        what += (
            "; for random allocation, pass RandomAllocationDataset(x, y, batch_size=..., epochs=...).dataset to fit "
            "(lastiter_plugins.adapters.tf_privacy)"
        )
    if fit.shuffle == "batch":
        what += " (for ragged and sparse inputs Keras 2.14 shuffles all the examples whenever shuffle is true)"
    raise AccountingError(
        f"sampling must be {' or '.join(s.value for s in allowed)} for {shown}, which {what}; "
        f"sampling={declared.value} contradicts it. Declare the sampling fit performs, or change fit's shuffle. "
        f"Found sampling={declared.value}."
    )


def reshuffle_covers_fixed(relation: Relation) -> bool:
    """Every bound proven for reshuffling under ``relation`` is also proven for a fixed order."""
    return all(
        spec.covers.get(Sampling.CYCLIC) is relation
        for spec in BOUNDS.values()
        if spec.covers.get(Sampling.RESHUFFLE) is relation
    )


def reshuffle_only_bounds(relation: Relation) -> list[str]:
    """Bounds proven for reshuffling under ``relation`` but not for a fixed order."""
    return [
        spec.id
        for spec in BOUNDS.values()
        if spec.covers.get(Sampling.RESHUFFLE) is relation and spec.covers.get(Sampling.CYCLIC) is not relation
    ]
