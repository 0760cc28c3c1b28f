r"""The lower end of a certified interval: the exact epsilon of an explicit instance that meets every
declaration of a pipeline (docs/derivations/lower-end.md#lower-end).

* :mod:`~lastiter_plugins.lower_end.instances`: which instance fits a pipeline and its declarations
  (:func:`lower_bound`), and its exact epsilon, rounded downward (the linear instances G1-G4).
* :mod:`~lastiter_plugins.lower_end.last_use`: cyclic runs, the last use on a cleared coordinate (G5 against
  a wall, G6 on an erased coordinate, with a clock).
* :mod:`~lastiter_plugins.lower_end.declarations`: an instance's constants (:class:`InstanceProperties`)
  checked against the declarations (:func:`violations`).
* :mod:`~lastiter_plugins.lower_end.mixture`: the exact epsilon, rounded downward, of the linear
  instances' one-dimensional Gaussian location mixtures at any n and T (half-line tests, a mixing
  law floored onto a lattice, counted tails).
* :mod:`~lastiter_plugins.lower_end.exact`: the exact last-iterate laws of the instances (linear
  losses G1, strongly convex quadratics G2, the projected walk G3) with certified intervals; the
  verification suite uses them as ground truths (and the tests check mixture.py against them).

This package belongs to the product: ``best`` with ``lower_bound=True`` reads it. It imports the
core (config, the math modules), never the verification suite.
"""

from lastiter_plugins.lower_end.instances import LowerBound, lower_bound

__all__ = ["LowerBound", "lower_bound"]
