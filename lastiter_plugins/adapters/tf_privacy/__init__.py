r"""TF Privacy / Keras glue: last-iterate accounting during ``model.fit``, checked at every step,
and a privacy statement to publish.

TF Privacy (0.9) has no accountant object: its Keras DP optimizers clip and
noise the gradients and users compute epsilon afterwards from the
hyperparameters. This module gives Keras users

* :class:`LastIterateCallback`, a ``keras.callbacks.Callback`` that reads the
  DP optimizer and ``fit``'s data pipeline, refuses every setting the bounds do
  not cover before the first step, then checks after every step what the
  compiled step actually did (batch, loss vector, clip norm, noise, learning
  rate, trainable variables, weights) and writes ``epsilon`` into the epoch
  logs; a mismatch raises ``lastiter_plugins.PipelineChangedError``;
* :class:`ProjectionCallback`, the projection onto an l2 ball that the
  bounded-domain bounds need;
* :func:`compute_last_iterate_privacy_statement`, the counterpart of TF
  Privacy's ``compute_dp_sgd_privacy_statement`` for the final model only.

Tested against tensorflow 2.14.1 (Keras 2.14.0) and tensorflow-privacy 0.9.0;
other versions are refused (``lastiter_plugins.UnsupportedHostError``). The
modules of this package, behind this facade: ``_observe`` (observation: what fit
was called with and what each step used; the only module that reads Keras' fit
locals and TF Privacy's private attributes), ``_derive`` (derivation: the
planned run from those facts, and every step compared with it), ``_callback``
(the thin callback that wires the two into ``fit``), ``_glm`` (certified linear
models: ``LastIterateCallback(..., model="glm")`` and ``FeatureNormClip``),
``_projection``, ``_statement`` and ``_errors``. See
docs/tf_privacy.md.
"""

from __future__ import annotations

try:
    import tensorflow  # noqa: F401
    import tensorflow_privacy  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lastiter_plugins.adapters.tf_privacy needs TensorFlow 2.14 and TF Privacy 0.9: "
        "pip install 'lastiter-plugins[tf]'. "
        f"Import failed with: {error}"
    ) from error

from ._callback import LastIterateCallback
from ._derive import DPOptimizerSettings, FitSettings, read_dp_optimizer
from ._errors import AccountingError
from ._glm import FeatureNormClip
from ._projection import ProjectionCallback
from ._statement import compute_last_iterate_privacy_statement

__all__ = [
    "AccountingError",
    "DPOptimizerSettings",
    "FeatureNormClip",
    "FitSettings",
    "LastIterateCallback",
    "ProjectionCallback",
    "compute_last_iterate_privacy_statement",
    "read_dp_optimizer",
]
