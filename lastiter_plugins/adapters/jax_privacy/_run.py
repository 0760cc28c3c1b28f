r"""The JAX API: a training loop of the user's over a ``jax_privacy.batch_selection`` strategy.

:class:`TrainingRun` maps the strategy to the core's scheme (:func:`._schemes.strategy_scheme`; refused, with the
reason, where no row covers it), hands the loop its batches (:meth:`TrainingRun.batches`), checking each one as it
is drawn against the scheme (the shared derivation, ``lastiter_plugins/adapters/_derivation.py``: one permutation
per pass, the same batches every cycle, no Poisson pass repeated; for random allocation, no example twice in a cycle)
and counting it as one noisy step, and makes the noise (:meth:`TrainingRun.privatizer`: ``gaussian_privatizer`` with
std ``noise_multiplier * l2_norm_bound`` of the clipped-gradient function it is given, whose bound is checked
against the declared clip and divisor). :meth:`TrainingRun.account` is the number for the steps drawn;
:meth:`TrainingRun.accountant` the same accountant for jax_privacy's calibration.

Stated, not observed (docs/jax_privacy.md): one noisy step per batch drawn, each example's gradient clipped once
and the sum divided by ``batch_size``; with ``update="sgd"``, plain SGD at ``learning_rate``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal, NoReturn

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.adapters._derivation import Derivation, DrawnBatch
from lastiter_plugins.config import resolve_relation
from lastiter_plugins.host import Account, Declaration, HostNumber, account, host_numbers
from lastiter_plugins.validation import validate_delta

from ._accountant import LastIterateTrainingAccountant
from ._report import HOST_FIXED_BATCH, HOST_POISSON, Report
from ._schemes import strategy_scheme

Sampling = lp.Sampling
_CYCLES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RANDOM_ALLOCATION)
_VOID = "; the epsilon of this run is void."


class TrainingRun:
    r"""One DP-SGD run over a batch selection strategy (the JAX API).

    Args:
      strategy: a ``jax_privacy.batch_selection`` strategy.
      num_examples: n, the examples it draws indices from.
      batch_size: b, the divisor of the clipped sum (``clipped_grad(normalize_by=b)``; jax_privacy's
        ``DpParams.batch_size``).
      noise_multiplier: z, the noise std over the clipped sum's sensitivity (``stddev / l2_norm_bound``).
      clip_norm: C (``clipped_grad(l2_clip_norm=C)``).
      delta: the delta of the epsilon.
      relation: the neighbouring relation; left out, the scheme's default
        (``lastiter_plugins.config.DEFAULT_RELATION``).
      update: ``"sgd"``: the loop applies plain SGD at the constant ``learning_rate`` (``optax.sgd(lr)``, no
        momentum); ``"any"`` (default): any update (the every-iterate rows only).
      learning_rate: the SGD learning rate (with ``update="sgd"``).
      assumptions: the loss assumptions (default: none).
      bound, published_only, require: as for the other hosts.
    """

    def __init__(
        self,
        strategy: Any,
        *,
        num_examples: int,
        batch_size: int,
        noise_multiplier: float,
        clip_norm: float,
        delta: float,
        relation: lp.Relation | str | None = None,
        update: lp.Update | str = lp.Update.ANY,
        learning_rate: float | None = None,
        assumptions: lp.LossAssumptions | None = None,
        bound: str = lp.BEST,
        published_only: bool = False,
        require: Literal["last_iterate"] | None = None,
    ) -> None:
        self.strategy = strategy
        self.num_examples = int(num_examples)
        self.batch_size = int(batch_size)  # the divisor of the user's step
        self.scheme = strategy_scheme(strategy, num_examples, batch_size)
        self.declaration = Declaration(bound=bound, published_only=published_only, require=require)
        self.delta = validate_delta(delta)
        self.relation = resolve_relation(relation, self.scheme.sampling)
        self.update = lp.Update.parse(update)
        if self.update is lp.Update.SGD and learning_rate is None:
            raise ValueError("update='sgd' needs learning_rate (the constant SGD step the loop applies).")
        self.learning_rate = learning_rate
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = float(clip_norm)
        self.assumptions = assumptions or lp.LossAssumptions()
        self.rescaled = False  # set by privatizer() when the clipped gradients are rescaled to unit norm
        self.noise_observed = False
        self.steps = 0
        self.failure: str | None = None
        impossible = lp.impossible_declaration(self._config(1), self.assumptions)  # every declaration checked now
        if impossible is not None:  # a real run has real losses
            raise lp.NotApplicableError(f"{impossible}. Found them declared to TrainingRun.")
        cycle = _cycle_length(strategy)
        sampling = self.scheme.sampling
        self._cycle = cycle if sampling in _CYCLES else None
        per_pass = cycle if self._cycle else int(strategy.iterations)
        rate = self.scheme.batch_size / self.scheme.dataset_size if sampling is Sampling.POISSON else None
        self.derivation = Derivation(sampling, self.scheme.dataset_size, per_pass, rate)
        self._calls = 0
        self._compact: dict[int, int] = {}  # shuffle_once over the kept examples: dataset index -> 0..n'-1
        self._in_cycle: set[int] = set()

    # -- the loop's batches
    def batches(self, rng: Any = None) -> Iterator[np.ndarray]:
        """The strategy's batches (``strategy.batch_iterator(num_examples, rng)``), each checked and counted as one
        noisy step when the loop receives it (a refusal raises PipelineChangedError and voids the run)."""
        call, self._calls = self._calls, self._calls + 1
        for position, indices in enumerate(self.strategy.batch_iterator(self.num_examples, rng=rng)):
            self._check(call, position, np.asarray(indices))
            yield indices

    def _check(self, call: int, position: int, indices: np.ndarray) -> None:
        if self.failure is not None:
            raise lp.PipelineChangedError(self.failure)
        raw = tuple(sorted(int(i) for i in indices.ravel()))
        if raw and (raw[0] < 0 or raw[-1] >= self.num_examples):
            self._fail(f"the indices of a batch must lie in [0, {self.num_examples}). Found {raw[0]}..{raw[-1]}")
        if self._cycle is None:
            drawn = DrawnBatch(call, position, raw)
        else:
            drawn = DrawnBatch(call * (1 << 32) + position // self._cycle, position % self._cycle, self._indices(raw))
            if self.scheme.sampling is Sampling.RANDOM_ALLOCATION:
                self._allocation(drawn)
        problem = self.derivation.check_step(drawn, len(raw))
        if problem is not None:
            self._fail(problem)
        self.steps += 1

    def _indices(self, raw: tuple[int, ...]) -> tuple[int, ...]:
        if self.scheme.dataset_size == self.num_examples:
            return raw
        compact = self._compact
        for i in raw:  # the first cycle fixes the kept examples; an example outside them is out of range
            compact.setdefault(i, len(compact))
        return tuple(sorted(compact[i] for i in raw))

    def _allocation(self, drawn: DrawnBatch) -> None:
        if drawn.position == 0:
            self._in_cycle = set()
        if self._in_cycle.intersection(drawn.indices):
            self._fail(
                "random_allocation puts each example in one step of the cycle. Found an example in two batches of "
                "one cycle"
            )
        self._in_cycle.update(drawn.indices)

    def _fail(self, message: str) -> NoReturn:
        self.failure = message + _VOID
        raise lp.PipelineChangedError(self.failure)

    # -- the noise
    def privatizer(self, clipped_fn: Any, prng_key: Any = None, **kwargs: Any) -> Any:
        """``jax_privacy.noise_addition.gaussian_privatizer`` adding the declared noise to the sums of
        ``clipped_fn`` (a ``jax_privacy.clipped_grad`` function): std ``noise_multiplier * clipped_fn.l2_norm_bound``,
        after checking that bound is ``clip_norm / batch_size`` (or ``1 / batch_size`` with
        ``rescale_to_unit_norm``, which divides the learning rate by C)."""
        from jax_privacy import noise_addition

        bound = float(clipped_fn.l2_norm_bound)
        b, c = self.batch_size, self.clip_norm
        if math.isclose(bound, c / b, rel_tol=1e-12):
            self.rescaled = False
        elif math.isclose(bound, 1.0 / b, rel_tol=1e-12):
            self.rescaled = True
        else:
            raise lp.NotApplicableError(
                f"clipped_fn.l2_norm_bound must be clip_norm / batch_size = {c}/{b} (or 1/{b} with "
                f"rescale_to_unit_norm). Found {bound!r}: clipped_grad(l2_clip_norm=..., normalize_by=...) differs "
                "from the run's declaration."
            )
        self.noise_observed = True
        return noise_addition.gaussian_privatizer(stddev=self.noise_multiplier * bound, prng_key=prng_key, **kwargs)

    # -- the numbers
    def _config(self, steps: int) -> lp.TrainingConfig:
        rate = self.learning_rate
        if rate is not None and self.rescaled:
            rate = rate / self.clip_norm
        return self.scheme.config(
            noise_multiplier=self.noise_multiplier,
            steps=steps,
            relation=self.relation,
            learning_rate=rate,
            clip_norm=self.clip_norm,
            update=self.update,
        )

    def account(self) -> Account:
        """The number for the steps drawn so far (raises PipelineChangedError for a void run)."""
        if self.failure is not None:
            raise lp.PipelineChangedError(self.failure)
        if self.steps == 0:
            raise ValueError("no batch was drawn yet: there is no run to account.")
        return account(self.declaration, self._config(self.steps), self.assumptions, self.delta)

    def epsilon(self) -> float:
        return float(self.account().result.epsilon)

    def accountant(self) -> LastIterateTrainingAccountant:
        """The run's accountant for ``jax_privacy.accounting.calibrate_*`` (the steps and noise it is asked for)."""
        rate = self.learning_rate
        if rate is not None and self.rescaled:
            rate = rate / self.clip_norm
        return LastIterateTrainingAccountant(
            self.scheme,
            num_examples=self.num_examples,
            relation=self.relation,
            learning_rate=rate,
            clip_norm=self.clip_norm,
            update=self.update,
            assumptions=self.assumptions,
            declaration=self.declaration,
        )

    def host_number(self) -> HostNumber | None:
        """What jax_privacy's accountant reports for this strategy (its Poisson or fixed-batch-size analysis), or
        None where it has none the comparison shows."""
        wanted = {Sampling.POISSON: HOST_POISSON, Sampling.RANDOM_BATCH: HOST_FIXED_BATCH}.get(self.scheme.sampling)
        if wanted is None:
            return None
        cfg = self._config(max(self.steps, 1))
        return next((h for h in host_numbers(cfg, self.delta, "jax-privacy") if h.id == wanted), None)

    def report(self) -> Report:
        noise = "made by TrainingRun.privatizer" if self.noise_observed else "declared (privatizer not made here)"
        how = f"{self.scheme.source}, batches checked as drawn; noise {noise}"
        note = self.scheme.every_iterate_only or ""
        return Report(self.account(), how, self.host_number(), steps=self.steps, note=note)


def _cycle_length(strategy: Any) -> int:
    return int(getattr(strategy, "cycle_length", 1) or 1)
