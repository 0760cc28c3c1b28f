r"""Which of the core's pipelines a jax_privacy run is: a batch selection strategy (the JAX API), or what
``fit`` draws and how the Keras optimizer accumulates (the Keras API).

Pure functions of the observed facts; they import no host library (the strategies are read by class name and
public fields, checked by the caller with :func:`lastiter_plugins.adapters.jax_privacy._internals`). The
arguments: docs/derivations/jax-privacy-adapter.md (parts 2, 4 and 5).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import lastiter_plugins as lp

Sampling = lp.Sampling


@dataclasses.dataclass(frozen=True)
class Scheme:
    """The core's pipeline shape for a run, before the noise and the steps are known.

    Attributes:
      sampling: the core's scheme.
      dataset_size: n of the pipeline (the examples the scheme can use; below the data's size where a strategy
        never uses some, docs/derivations/jax-privacy-adapter.md#jp-strategies).
      batch_size: b, the divisor of the clipped sum (Poisson and random allocation: the expected size).
      every_iterate_only: why only the every-iterate rows cover the run (the pipeline gets ``update="any"``), or
        None.
      relations: the neighbouring relations the mapping is argued for (None: those of the rows).
      source: what was mapped, in words (for reports).
    """

    sampling: Sampling
    dataset_size: int
    batch_size: int
    every_iterate_only: str | None = None
    relations: tuple[lp.Relation, ...] | None = None
    source: str = ""

    def config(
        self,
        *,
        noise_multiplier: float,
        steps: int,
        relation: lp.Relation,
        learning_rate: float | None,
        clip_norm: float,
        update: lp.Update,
    ) -> lp.TrainingConfig:
        """The pipeline of ``steps`` steps (raises NotApplicableError when the mapping is not argued for
        ``relation``)."""
        relation = lp.Relation.parse(relation)
        if self.relations is not None and relation not in self.relations:
            allowed = " or ".join(r.value for r in self.relations)
            raise lp.NotApplicableError(
                f"relation must be {allowed} for {self.source} (docs/derivations/jax-privacy-adapter.md). "
                f"Found {relation.value}."
            )
        if self.every_iterate_only is not None:
            update = lp.Update.ANY
        return lp.TrainingConfig(
            dataset_size=self.dataset_size,
            batch_size=self.batch_size,
            noise_multiplier=noise_multiplier,
            steps=steps,
            sampling=self.sampling,
            learning_rate=learning_rate,
            clip_norm=clip_norm,
            relation=relation,
            update=update,
        )


class NotCoveredError(lp.NotApplicableError):
    """No row of the table covers the strategy (the message says why and what would be covered)."""


def _steps_of(n: int, b: int) -> int:
    return -(-n // b)


def cycle_batch_size(dataset_size: int, cycle_length: int) -> tuple[int, bool]:
    """The smallest divisor b' with ``ceil(n / b') <= l``, and whether ``ceil(n / b') == l`` (then no integer gives
    exactly l steps when False; docs/derivations/jax-privacy-adapter.md#jp-fixed-bins)."""
    b = -(-dataset_size // cycle_length)
    return b, _steps_of(dataset_size, b) == cycle_length


def strategy_scheme(strategy: Any, num_examples: int, batch_size: int) -> Scheme:
    """The scheme of a ``jax_privacy.batch_selection`` strategy drawing from ``num_examples`` examples, whose
    steps divide the clipped sum by ``batch_size`` (jax_privacy's ``DpParams.batch_size``).

    Raises:
      NotCoveredError: no row covers the strategy (cyclic Poisson with a rate below 1, truncation, sampling with
        replacement, b-min-sep, user-level selection, a strategy of the user's), or the divisor does not fit it.
    """
    n, b = int(num_examples), int(batch_size)
    kind = type(strategy).__name__
    if kind == "CyclicPoissonSampling":
        return _cyclic_poisson(strategy, n, b)
    if kind == "FixedBatchSampling":
        if strategy.replace:
            raise NotCoveredError(
                "FixedBatchSampling(replace=True) may put one example in a batch twice (two clipped gradients of "
                "one example: sensitivity 2C under add-or-remove). No row covers it: use replace=False "
                "(random_batch)."
            )
        if strategy.batch_size != b:
            raise NotCoveredError(
                f"batch_size (the divisor of the clipped sum) must be FixedBatchSampling.batch_size = "
                f"{strategy.batch_size} for random_batch. Found {b}."
            )
        return Scheme(Sampling.RANDOM_BATCH, n, b, source=f"FixedBatchSampling(batch_size={b})")
    if kind == "BallsInBinsSampling":
        return _balls_in_bins(strategy, n, b)
    if kind == "BMinSepSampling":
        raise NotCoveredError(
            "BMinSepSampling (b-min-sep sampling, arXiv 2602.09338) has no row: jax_privacy itself accounts it by "
            "Monte Carlo only. Use CyclicPoissonSampling (poisson) or BallsInBinsSampling over one cycle "
            "(random_allocation)."
        )
    if kind == "UserSelectionStrategy":
        raise NotCoveredError(
            "UserSelectionStrategy selects users, several examples each: every row is for example-level privacy "
            "(one example per record). No row covers user-level sampling."
        )
    raise NotCoveredError(
        f"the strategy must be one of jax_privacy.batch_selection's CyclicPoissonSampling, FixedBatchSampling, "
        f"BallsInBinsSampling. Found {kind}: its batches follow no law a row covers."
    )


def _cyclic_poisson(strategy: Any, n: int, b: int) -> Scheme:
    rate, cycle = float(strategy.sampling_prob), int(strategy.cycle_length)
    if strategy.truncated_batch_size is not None:
        raise NotCoveredError(
            f"CyclicPoissonSampling(truncated_batch_size={strategy.truncated_batch_size}) drops examples from "
            "large batches: no row covers truncated Poisson sampling. Leave truncated_batch_size=None."
        )
    if cycle == 1:
        if not math.isclose(rate * n, b, rel_tol=1e-12, abs_tol=0.0):
            raise NotCoveredError(
                f"sampling_prob must be batch_size / num_examples = {b}/{n} = {b / n!r} for poisson (the rows take "
                f"q = b/n with b the divisor of the clipped sum). Found {rate!r}."
            )
        return Scheme(Sampling.POISSON, n, b, source=f"CyclicPoissonSampling(sampling_prob={rate!r})")
    if rate != 1.0:
        raise NotCoveredError(
            f"CyclicPoissonSampling(cycle_length={cycle}, sampling_prob={rate!r}) samples by Poisson within each "
            "cycle: no row covers cyclic Poisson sampling. Use cycle_length=1 (poisson) or sampling_prob=1 "
            "(shuffle_once)."
        )
    if strategy.partition_type.name != "EQUAL_SPLIT":
        return _balls_in_bins_cycles(cycle, int(strategy.iterations), n, b, "CyclicPoissonSampling(INDEPENDENT)")
    group = n // cycle
    if group < 1:
        raise NotCoveredError(f"cycle_length must be <= num_examples = {n}. Found {cycle}.")
    if b != group:
        raise NotCoveredError(
            f"batch_size (the divisor of the clipped sum) must be num_examples // cycle_length = {group} for "
            f"CyclicPoissonSampling(sampling_prob=1, cycle_length={cycle}), whose batches hold {group} examples. "
            f"Found {b}."
        )
    return Scheme(
        Sampling.SHUFFLE_ONCE,
        cycle * group,
        group,
        relations=(lp.Relation.REPLACE_ONE,),
        source=f"CyclicPoissonSampling(sampling_prob=1, cycle_length={cycle}) (equal split: {cycle * group} of "
        f"{n} examples used)",
    )


def _balls_in_bins(strategy: Any, n: int, b: int) -> Scheme:
    cycle, iterations = int(strategy.cycle_length), int(strategy.iterations)
    return _balls_in_bins_cycles(cycle, iterations, n, b, f"BallsInBinsSampling(cycle_length={cycle})")


def _balls_in_bins_cycles(cycle: int, iterations: int, n: int, b: int, source: str) -> Scheme:
    if iterations <= cycle:
        if _steps_of(n, b) != cycle:
            raise NotCoveredError(
                f"batch_size (the divisor of the clipped sum) must satisfy ceil(num_examples / batch_size) = "
                f"cycle_length = {cycle} for random_allocation over one cycle (the rows take ceil(n/b) steps per "
                f"epoch). Found ceil({n}/{b}) = {_steps_of(n, b)}."
            )
        return Scheme(Sampling.RANDOM_ALLOCATION, n, b, source=f"{source} over one cycle")
    divisor, _ = cycle_batch_size(n, cycle)
    return Scheme(
        Sampling.CYCLIC,
        n,
        divisor,
        every_iterate_only=(
            f"{source} keeps its bins for all {iterations} steps ({-(-iterations // cycle)} cycles): not random "
            "allocation (bins drawn afresh every epoch), nor the equal batches of the cyclic rows; only the "
            "every-iterate epoch baselines cover it (docs/derivations/jax-privacy-adapter.md#jp-fixed-bins)"
        ),
        relations=(lp.Relation.REPLACE_ONE,),
        source=f"{source} over {-(-iterations // cycle)} cycles",
    )


# -- the Keras API


@dataclasses.dataclass(frozen=True)
class KerasShape:
    """The pipeline a Keras ``fit`` of jax_privacy runs, from what is observed: the scheme of the physical batches
    and how the optimizer groups them.

    Attributes:
      scheme: the scheme of the updates (the physical batches when ``physical``).
      accumulation: k, physical batches per update.
      physical: the pipeline counts physical steps with noise multiplier ``z / sqrt(k)`` (the groups are not one
        batch of the scheme, docs/derivations/jax-privacy-adapter.md#jp-accumulation).
    """

    scheme: Scheme
    accumulation: int
    physical: bool

    def noise_multiplier(self, traced: float) -> float:
        """The pipeline's noise multiplier from the traced one of a physical step (``stddev / l2_norm_bound``)."""
        return traced if self.physical else traced * math.sqrt(self.accumulation)

    def steps(self, physical_steps: int) -> int:
        """The pipeline's steps after ``physical_steps`` physical steps (a group not yet complete moved nothing)."""
        return physical_steps if self.physical else physical_steps // self.accumulation


def keras_shape(sampling: Sampling, dataset_size: int, batch_size: int, batches_per_pass: int, k: int) -> KerasShape:
    """The Keras pipeline: physical batches of ``batch_size`` drawn by ``sampling`` from ``dataset_size`` examples,
    ``batches_per_pass`` per pass (epoch schemes), k physical batches per update."""
    physical = Scheme(sampling, dataset_size, batch_size, source=f"Keras fit ({sampling.value})")
    if k == 1:
        return KerasShape(physical, 1, physical=False)
    grouped = sampling in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE) and batches_per_pass % k == 0
    if grouped and dataset_size % batch_size == 0:
        return KerasShape(
            Scheme(
                sampling, dataset_size, batch_size * k, source=f"Keras fit ({sampling.value}), {k} batches per update"
            ),
            k,
            physical=False,
        )
    why = (
        f"{k} independent Poisson batches per update are not one Poisson batch"
        if sampling is Sampling.POISSON
        else f"a group of {k} batches can straddle two passes ({batches_per_pass} batches per pass)"
    )
    return KerasShape(
        dataclasses.replace(
            physical,
            every_iterate_only=f"gradient accumulation over {k} batches: {why}; the physical steps are accounted "
            f"(noise multiplier z/sqrt({k})), every iterate (docs/derivations/jax-privacy-adapter.md#jp-accumulation)",
        ),
        k,
        physical=True,
    )
