r"""jax_privacy glue: the valid epsilon of DP-SGD runs of jax_privacy 2.0 (Keras 3 on JAX, and the JAX API).

* The Keras route: :func:`watch` a model made private by ``jax_privacy.keras_api.make_private``; every ``fit``
  call is observed (the indices of every batch ``fit`` feeds the step, the clip, divisor and noise the step was
  compiled with, the optimizer, the rules reading a metric, the linear model on ``model_kind="glm"``) and the
  :class:`KerasAccountant` reports ``best`` over the rows whose preconditions held, with jax_privacy's own number
  beside it (NOT VALID when ``fit`` shuffles, the default: ``DPKerasConfig(poisson_sampling_in_fit=False)``).
  :func:`calibrate` gives the noise multiplier for the scheme ``fit`` actually runs.
* The JAX API: a :class:`TrainingRun` over a ``jax_privacy.batch_selection`` strategy checks each batch as the
  loop draws it, makes the noise (:meth:`TrainingRun.privatizer`) and gives the number for the steps drawn;
  :meth:`TrainingRun.accountant` is a :class:`LastIterateTrainingAccountant` for
  ``jax_privacy.accounting.calibrate_noise_multiplier`` and friends.

Tested against jax_privacy 2.0.0, Keras 3.15 (JAX backend) and jax 0.10; other versions are refused
(``lastiter_plugins.UnsupportedHostError``). The modules behind this facade: ``_internals`` (everything read or
patched in the hosts), ``_schemes`` (which pipeline a strategy or a fit is), ``_keras_facts`` (a fit call, the
optimizer, the metric rules), ``_keras`` (the Keras ledger), ``_glm`` (the certified linear model),
``_calibration``, ``_run`` (the JAX API), ``_accountant`` (jax_privacy's accountant interface) and ``_report``.
See docs/jax_privacy.md and docs/derivations/jax-privacy-adapter.md.
"""

from __future__ import annotations

try:
    import jax_privacy  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lastiter_plugins.adapters.jax_privacy needs jax_privacy 2.0 (Python >= 3.11): "
        "pip install 'lastiter-plugins[jax]'. "
        f"Import failed with: {error}"
    ) from error

from ._accountant import LastIterateTrainingAccountant
from ._calibration import Calibration, calibrate
from ._keras import KerasAccountant, watch
from ._report import Report
from ._run import TrainingRun
from ._schemes import NotCoveredError, Scheme, strategy_scheme

__all__ = [
    "Calibration",
    "KerasAccountant",
    "LastIterateTrainingAccountant",
    "NotCoveredError",
    "Report",
    "Scheme",
    "TrainingRun",
    "calibrate",
    "strategy_scheme",
    "watch",
]
