r"""Verification suite: exact divergences on instances with computable laws
(docs/verification.md), soundness fuzzing and the tightness report.

Nothing in the product imports this subpackage; it imports the public API
(``import lastiter_plugins as lp``), the math modules (bounds, profiles) and the
exact laws of :mod:`lastiter_plugins.lower_end.exact`, which the product's lower
end (``lower_bound=True``, docs/derivations/lower-end.md#lower-end) shares with it; timings
against host libraries live in benchmarks/. See docs/verification.md for the
mathematics and the commands.

* :mod:`~lastiter_plugins.lower_end.exact` (re-exported here): ground truths G1 (linear
  losses), G2 (strongly convex quadratics) and G3 (the projected 1-D random walk
  of Altschuler & Talwar), each returning a certified interval
  ``[lower, upper]`` for the Renyi divergence of the last iterate, and on
  request certified bounds on its privacy profile (hockey-stick divergence).
* :mod:`~lastiter_plugins.verification.fuzz`: random instances meeting each
  bound's assumptions; checks ``bound >= lower`` (Renyi, and for f-DP bounds
  also the privacy profile).
* :mod:`~lastiter_plugins.verification.tightness`: ``bound / exact`` on a
  fixed grid, as markdown and PNG (``python -m lastiter_plugins.verification.tightness``).
"""

from lastiter_plugins.lower_end.exact import (
    ExactDivergence,
    GaussianLaws,
    HockeyStick,
    Instance,
    g1_divergence,
    g1_laws,
    g2_divergence,
    g2_laws,
    g3_divergence,
    gaussian_mixture_hockey_stick,
    gaussian_mixture_renyi,
)

__all__ = [
    "ExactDivergence",
    "GaussianLaws",
    "HockeyStick",
    "Instance",
    "g1_divergence",
    "g1_laws",
    "g2_divergence",
    "g2_laws",
    "g3_divergence",
    "gaussian_mixture_hockey_stick",
    "gaussian_mixture_renyi",
]
