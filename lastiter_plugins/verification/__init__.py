r"""Verification suite: exact divergences on instances with computable laws
(BOUNDS.md section 6), soundness fuzzing, the tightness report and timings.

Nothing in the accountant imports this subpackage; it imports the public API
only. See docs/verification.md for the mathematics and the commands.

* :mod:`~lastiter_plugins.verification.exact`: ground truths G1 (linear
  losses), G2 (strongly convex quadratics) and G3 (the projected 1-D random walk
  of Altschuler & Talwar), each returning a certified interval
  ``[lower, upper]`` for the Renyi divergence of the last iterate.
* :mod:`~lastiter_plugins.verification.fuzz`: random instances meeting each
  bound's assumptions; checks ``bound >= lower``.
* :mod:`~lastiter_plugins.verification.tightness`: ``bound / exact`` on a
  fixed grid, as markdown and PNG (``python -m lastiter_plugins.verification.tightness``).
* :mod:`~lastiter_plugins.verification.benchmark`: timing helpers.
"""

from lastiter_plugins.verification.exact import (
    ExactDivergence,
    Instance,
    g1_divergence,
    g2_divergence,
    g3_divergence,
    gaussian_mixture_renyi,
)

__all__ = [
    "ExactDivergence",
    "Instance",
    "g1_divergence",
    "g2_divergence",
    "g3_divergence",
    "gaussian_mixture_renyi",
]
