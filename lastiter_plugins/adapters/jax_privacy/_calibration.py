r"""Calibration for the Keras route: the smallest noise multiplier whose epsilon, for the scheme ``fit`` will
actually run, meets a target (:func:`lastiter_plugins.calibrate_noise` on the pipeline of
:func:`._schemes.keras_shape`), and jax_privacy's own number for that noise beside it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import lastiter_plugins as lp
from lastiter_plugins.config import resolve_relation
from lastiter_plugins.host import HostNumber, host_numbers

from ._report import HOST_POISSON
from ._schemes import KerasShape, keras_shape


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A noise multiplier for a ``DPKerasConfig`` and what it gives.

    Attributes:
      noise_multiplier: z for ``DPKerasConfig(noise_multiplier=z)`` (per update, jax_privacy's convention).
      result: the core's epsilon for the run ``fit`` will do with it (<= the target).
      host: jax_privacy's own number for it (display only; NOT VALID when ``fit`` shuffles).
    """

    noise_multiplier: float
    result: lp.EpsilonResult
    host: HostNumber

    def apply(self, config: Any) -> Any:
        """``config`` with this noise multiplier. ``DPKerasConfig`` checks its own Poisson number against its
        ``epsilon``: where that number is larger (our bound is below jax_privacy's accountant), set the config's
        ``epsilon`` to at least ``host.epsilon`` (the budget field of its own accountant); raises ValueError
        naming it."""
        host = self.host.epsilon
        if host is not None and host > config.epsilon + 0.1:  # DPKerasConfig's own tolerance
            raise ValueError(
                f"DPKerasConfig checks its own accountant (Poisson, every iterate): {self.host.label} gives epsilon "
                f"{host:.4g} for noise_multiplier {self.noise_multiplier:.6g}, above its epsilon = {config.epsilon} "
                f"(the core's number for the run is {self.result.epsilon:.4g}, {self.result.relation.value}, covering "
                f"{self.result.protects.value}). Set DPKerasConfig(epsilon=...) to at least {host:.4g} so that "
                "jax_privacy accepts the noise."
            )
        return dataclasses.replace(config, noise_multiplier=self.noise_multiplier)


def planned_shape(config: Any, shuffle: bool | Literal["batch"]) -> KerasShape:
    """The pipeline shape ``fit`` will run for ``config`` (Poisson in fit, or Keras' shuffle of arrays)."""
    b, n = int(config.batch_size), int(config.train_size)
    if config.poisson_sampling_in_fit:
        sampling, per_pass = lp.Sampling.POISSON, max(1, n // b)
    else:
        sampling = lp.Sampling.RESHUFFLE if shuffle is True else lp.Sampling.CYCLIC
        per_pass = -(-n // b)
    return keras_shape(sampling, n, b, per_pass, int(config.gradient_accumulation_steps))


def calibrate(
    config: Any,
    target_epsilon: float,
    *,
    relation: lp.Relation | str | None = None,
    shuffle: bool | Literal["batch"] = True,
    learning_rate: float | None = None,
    assumptions: lp.LossAssumptions | None = None,
    bound: str = lp.BEST,
    published_only: bool = False,
) -> Calibration:
    r"""The noise multiplier for ``config`` (a ``jax_privacy.keras_api.DPKerasConfig``) whose epsilon at
    ``config.delta`` meets ``target_epsilon`` for the run ``fit`` will do: ``config.train_steps`` physical steps,
    Poisson in ``fit`` when ``config.poisson_sampling_in_fit``, else Keras' ``shuffle`` of the arrays (the
    default ``True`` reshuffles every pass).

    Args:
      relation: left out, the default of the scheme fit runs (``lastiter_plugins.config.DEFAULT_RELATION``).
      learning_rate: the Keras SGD learning rate (None: only the rows that do not need it), divided by the
        clipping norm when ``config.rescale_to_unit_norm`` (docs/derivations/jax-privacy-adapter.md#jp-keras-step).

    Raises:
      CalibrationError: no noise multiplier up to the core's cap meets the target.
    """
    shape = planned_shape(config, shuffle)
    k = shape.accumulation
    rate = None if learning_rate is None else float(learning_rate)
    if rate is not None and config.rescale_to_unit_norm:
        rate /= float(config.clipping_norm)
    update = lp.Update.SGD if rate is not None else lp.Update.ANY
    base = shape.scheme.config(
        noise_multiplier=1.0,
        steps=max(1, shape.steps(int(config.train_steps))),
        relation=resolve_relation(relation, shape.scheme.sampling),
        learning_rate=rate,
        clip_norm=float(config.clipping_norm),
        update=update,
    )
    loss = assumptions or lp.LossAssumptions()
    impossible = lp.impossible_declaration(base, loss)  # a real run has real losses
    if impossible is not None:
        raise lp.NotApplicableError(f"{impossible}. Found them declared to calibrate.")
    pipeline_z = float(
        lp.calibrate_noise(
            bound, target_epsilon, config.delta, published_only=published_only, config=base, assumptions=loss
        )
    )
    z = pipeline_z * math.sqrt(k) if shape.physical else pipeline_z  # DPKerasConfig's z is per update
    result = lp.epsilon(
        bound,
        config.delta,
        published_only=published_only,
        config=base.replace(noise_multiplier=pipeline_z),
        assumptions=loss,
    )
    poisson = lp.TrainingConfig(
        dataset_size=int(config.train_size),
        batch_size=int(config.effective_batch_size),
        noise_multiplier=z,
        steps=int(config.train_steps),
        sampling=lp.Sampling.POISSON,
        relation=lp.Relation.ADD_OR_REMOVE_ONE,
        update=lp.Update.ANY,
    )
    (host,) = (h for h in host_numbers(poisson, config.delta, "jax-privacy") if h.id == HOST_POISSON)
    if base.sampling is not lp.Sampling.POISSON or shape.physical:
        host = dataclasses.replace(
            host, valid=False, why_not=f"fit runs {base.sampling.value} batches, not its Poisson batches"
        )
    return Calibration(z, result, host)
