r"""An accountant jax_privacy's calibration can use: :class:`LastIterateTrainingAccountant`.

``jax_privacy.accounting.calibrate_noise_multiplier``, ``calibrate_num_updates`` and ``calibrate_batch_size``
(2.0.0) take a ``DpTrainingAccountant``: they ask ``can_calibrate_*()`` and call
``compute_epsilon(num_updates, DpParams(noise_multipliers, batch_size, num_samples, delta, ...))``, bisecting on
the result (``noise_multipliers`` from 0 up, so ``z = 0`` must give infinity). This accountant answers with the
core's number (``best``, or the bound asked for) for the pipeline the run's strategy maps to
(:func:`._schemes.strategy_scheme`), the noise multiplier, steps and divisor ``batch_size`` of ``DpParams``.
``DpParams.sampling_method`` is jax_privacy's assumption for its own analysis and is not read: the scheme is the
strategy's.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from jax_privacy.accounting import accountants, analysis

import lastiter_plugins as lp
from lastiter_plugins.host import Declaration, account

from ._schemes import Scheme

#: Schemes whose batch size is free (not tied to a cycle length), so the divisor can be calibrated.
_FREE_BATCH = (lp.Sampling.POISSON, lp.Sampling.RANDOM_BATCH)


class LastIterateTrainingAccountant(analysis.DpTrainingAccountant):
    """``jax_privacy.accounting.DpTrainingAccountant`` over the core (made by ``TrainingRun.accountant()``).

    Args:
      scheme: the pipeline shape of the run's strategy.
      num_examples: n, the examples the strategy draws from (``DpParams.num_samples`` must equal it).
      relation: the neighbouring relation.
      learning_rate: the constant plain-SGD learning rate in the core's units (None: unknown).
      clip_norm: C.
      update: ``sgd`` (plain SGD at ``learning_rate``) or ``any``.
      assumptions: the loss assumptions.
      declaration: the bound asked for and ``best``'s restrictions.
    """

    def __init__(
        self,
        scheme: Scheme,
        *,
        num_examples: int,
        relation: lp.Relation,
        learning_rate: float | None,
        clip_norm: float,
        update: lp.Update,
        assumptions: lp.LossAssumptions,
        declaration: Declaration,
    ) -> None:
        # jax_privacy's base stores a dp-accounting configuration; the core accounts instead, so it is unused.
        super().__init__(dp_accountant_config=accountants.PldAccountantConfig())
        self.scheme = scheme
        self.num_examples = int(num_examples)
        self.relation = relation
        self.learning_rate = learning_rate
        self.clip_norm = float(clip_norm)
        self.update = update
        self.assumptions = assumptions
        self.declaration = declaration

    def can_calibrate_steps(self) -> bool:
        return True

    def can_calibrate_batch_size(self) -> bool:
        return self.scheme.sampling in _FREE_BATCH

    def can_calibrate_noise_multipliers(self) -> bool:
        return True

    def _validate_dp_params(self, dp_params: analysis.DpParams) -> None:
        super()._validate_dp_params(dp_params)
        if not isinstance(dp_params.noise_multipliers, numbers.Real):
            raise ValueError(
                "noise_multipliers must be one number for LastIterateTrainingAccountant (the rows take one noise "
                f"multiplier). Found {dp_params.noise_multipliers!r}."
            )
        if not isinstance(dp_params.batch_sizes, int):
            raise ValueError(f"batch_size must be one integer (no schedule). Found {dp_params.batch_sizes!r}.")
        for name, value, allowed in (
            ("examples_per_user", dp_params.examples_per_user, (None, 1)),
            ("truncated_batch_size", dp_params.truncated_batch_size, (None,)),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed} for LastIterateTrainingAccountant. Found {value!r}.")
        if dp_params.num_samples != self.num_examples:
            raise ValueError(
                f"num_samples must be the run's num_examples = {self.num_examples}. Found {dp_params.num_samples}."
            )
        if self.scheme.sampling not in _FREE_BATCH and dp_params.batch_size != self.scheme.batch_size:
            raise ValueError(
                f"batch_size must be {self.scheme.batch_size} for {self.scheme.source} (its cycle fixes it). Found "
                f"{dp_params.batch_size}."
            )

    def _compute_epsilon(self, num_updates: Any, dp_params: analysis.DpParams) -> float:
        noise = float(dp_params.noise_multipliers)  # checked: one number
        if noise == 0.0:
            return float("inf")  # no noise: no guarantee (calibration's bracket starts here)
        scheme = self.scheme
        if scheme.sampling in _FREE_BATCH:
            scheme = dataclasses.replace(scheme, batch_size=int(dp_params.batch_size))
        config = scheme.config(
            noise_multiplier=noise,
            steps=int(num_updates),
            relation=self.relation,
            learning_rate=self.learning_rate,
            clip_norm=self.clip_norm,
            update=self.update,
        )
        return float(account(self.declaration, config, self.assumptions, dp_params.delta).result.epsilon)
