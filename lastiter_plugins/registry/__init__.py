r"""Which bound applies to which pipeline: the dispatch table.

One :class:`BoundSpec` per bound id: the sampling schemes it covers (with the neighbouring relation it is
proven for), the conditions it needs, the glue computing it, how it is justified and what it protects. The
package holds:

* :mod:`~lastiter_plugins.registry.spec`: the types (:class:`BoundSpec`, :class:`Proof`, :class:`Provenance`,
  :class:`Unmet`, :class:`Applicability`, :class:`Kind`, :class:`Protects`, :class:`BySampling`);
* :mod:`~lastiter_plugins.registry.conditions`: the preconditions, and the checks that say when a pipeline
  leaves a published statement;
* :mod:`~lastiter_plugins.registry.table`: the rows, with the citations and prose they share
  (:data:`BOUNDS`, :data:`BOUND_IDS`);
* :mod:`~lastiter_plugins.registry.lookup`: :func:`get_spec`, :func:`applicability`, :func:`require`,
  :func:`rdp_curve`, :func:`estimate_curve`.

The glue (the mapping of DP-SGD hyperparameters to a paper's symbols) is in the paper's module under
:mod:`lastiter_plugins.bounds`, typed by :mod:`lastiter_plugins.bounds._glue`; the table imports it, never the
other way round.
"""

from __future__ import annotations

from lastiter_plugins.defaults import BEST
from lastiter_plugins.registry.lookup import applicability, estimate_curve, get_spec, rdp_curve, require
from lastiter_plugins.registry.spec import (
    ALL_SCHEMES,
    AT_MOST_B_SCHEMES,
    DERIVED_HERE,
    EPOCH_SCHEMES,
    FIXED_BATCH_SCHEMES,
    PROVEN,
    PUBLISHED,
    UNPROVEN,
    Applicability,
    BoundSpec,
    BySampling,
    Condition,
    Kind,
    LowerEstimate,
    OutsidePublished,
    PrivacyProfile,
    ProfileFunction,
    Proof,
    Protects,
    Provenance,
    RdpFunction,
    Unmet,
    provenance_short,
    provenance_word,
)
from lastiter_plugins.registry.table import (
    ALTSCHULER_TALWAR,
    BOK_SU_ALTSCHULER,
    BOUND_IDS,
    BOUNDS,
    DOCS,
    KONG_RIBERO,
    LIANG,
    YE_SHOKRI,
)

__all__ = [
    "ALL_SCHEMES",
    "ALTSCHULER_TALWAR",
    "AT_MOST_B_SCHEMES",
    "BEST",
    "BOK_SU_ALTSCHULER",
    "BOUNDS",
    "BOUND_IDS",
    "DERIVED_HERE",
    "DOCS",
    "EPOCH_SCHEMES",
    "FIXED_BATCH_SCHEMES",
    "KONG_RIBERO",
    "LIANG",
    "PROVEN",
    "PUBLISHED",
    "UNPROVEN",
    "YE_SHOKRI",
    "Applicability",
    "BoundSpec",
    "BySampling",
    "Condition",
    "Kind",
    "LowerEstimate",
    "OutsidePublished",
    "PrivacyProfile",
    "ProfileFunction",
    "Proof",
    "Protects",
    "Provenance",
    "RdpFunction",
    "Unmet",
    "applicability",
    "estimate_curve",
    "get_spec",
    "provenance_short",
    "provenance_word",
    "rdp_curve",
    "require",
]
