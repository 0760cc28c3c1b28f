r"""TF Privacy / Keras glue: the valid epsilon of ``model.fit`` with TF Privacy's DP Keras optimizers, checked
at every step, and a privacy statement to publish.

TF Privacy (0.9) has no accountant object: its Keras DP optimizers clip and noise the gradients and users
compute epsilon afterwards from the hyperparameters. This module gives Keras users

* :class:`LastIterateCallback`, a ``keras.callbacks.Callback`` that reads the DP optimizer and ``fit``'s
  data (in-memory arrays or a ``tf.data`` pipeline), runs its checks before the first step and on what every
  compiled step recorded, and writes ``epsilon`` (``best`` over the rows whose preconditions held at every
  step), TF Privacy's own number and their ratio into the epoch logs; ``report`` says which rows left and why;
* :class:`RandomAllocationDataset`, random allocation as a ``tf.data`` input for ``fit`` (a fresh allocation
  every epoch, every batch padded to a fixed length, checked by the callback step by step);
* :class:`ProjectionCallback`, the projection onto an l2 ball that the bounded-domain bounds need;
* :func:`compute_last_iterate_privacy_statement`, the counterpart of TF Privacy's
  ``compute_dp_sgd_privacy_statement``.

Tested against tensorflow 2.14.1 (Keras 2.14.0) and tensorflow-privacy 0.9.0; other versions are refused
(``lastiter_plugins.UnsupportedHostError``). The modules of this package, behind this facade: ``_observe``
(host internals: what fit was called with, the DP optimizer's private attributes, the probe recording every
compiled step), ``_tfdata`` (a tf.data pipeline's transformations), ``_allocation_input`` (the random
allocation input), ``_settings`` (the mechanism and fit's
scheme derived from those facts), ``checks/`` (one file per run check: the rows each gates), ``_run`` (the
ledger of one fit call), ``_callback`` (the thin callback), ``_report``, ``_glm`` (certified linear models:
``model="glm"`` and ``FeatureNormClip``), ``_projection``, ``_statement`` and ``_errors``. See
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

from ._allocation_input import RandomAllocationDataset
from ._callback import LastIterateCallback
from ._errors import AccountingError
from ._glm import FeatureNormClip
from ._projection import ProjectionCallback
from ._report import Report
from ._settings import DPOptimizerSettings, FitSettings, read_dp_optimizer
from ._statement import compute_last_iterate_privacy_statement

__all__ = [
    "AccountingError",
    "DPOptimizerSettings",
    "FeatureNormClip",
    "FitSettings",
    "LastIterateCallback",
    "ProjectionCallback",
    "RandomAllocationDataset",
    "Report",
    "compute_last_iterate_privacy_statement",
    "read_dp_optimizer",
]
