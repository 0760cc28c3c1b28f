r"""dp-accounting adapter: last-iterate DP-SGD runs as ``DpEvent``\ s, and two
``PrivacyAccountant``\ s that compose them with dp-accounting's standard events.

* :class:`LastIterateDpSgdEvent` describes one DP-SGD training run whose FINAL
  model only is released: the mechanism (data, batches, noise, steps, step
  size, clipping, projection) and the loss assumptions, nothing about how to
  account for it (dp_event.py's contract: an event describes the mechanism,
  the accountant decides how to account for it).
* :class:`LastIterateAccountant` is a ``dp_accounting.PrivacyAccountant``
  configured with the bound it accounts last-iterate runs with
  (``bound="best"`` by default; any id of ``lastiter_plugins.BOUND_IDS``). A
  last-iterate event contributes ``count`` times its RDP curve
  (:func:`lastiter_plugins.rdp` for that bound and the accountant's
  neighbouring relation); every other event (Gaussian, Laplace, Poisson /
  without-replacement sampled, RepeatAndSelect, ZCDp on 0.6, ...) is delegated
  to dp-accounting's ``rdp.RdpAccountant`` with the same orders and relation.
  So one accountant covers a pipeline mixing last-iterate runs with standard
  mechanisms. A ledger holding one run and nothing else is answered exactly as
  :func:`lastiter_plugins.epsilon` answers for it (lossless, f-DP
  bounds included); any composition is converted from the summed RDP on the
  order grid.
* :class:`LastIteratePldAccountant` composes runs certified mu-GDP (an f-DP
  bound whose privacy profile is one Gaussian) as the dominating Gaussian
  mechanism in dp-accounting's ``PLDAccountant``, with the standard events
  there (tighter than adding RDP curves; the host's discretisation rounds
  pessimistically).

Validation happens before any state changes (dp-accounting's own base class
updates the ledger before its real composition pass, so a late failure
leaves a ledger that disagrees with the RDP; we plan the whole composition
first, then commit). ``supports()`` is False for events whose parameters are
invalid, whose bound does not apply, or whose bound is proven for another
neighbouring relation. An unproven bound (asked for by name) is marked in the
statements and warned about (``lastiter_plugins.UnprovenBoundWarning``) where
its number is given bare (``get_epsilon``, ``get_delta``, an event's ``rdp``).

Tested against dp-accounting 0.4.3 (pinned by TF Privacy 0.9) and 0.6.0.

Modules of this package, one job each: ``_events`` (the event, the enums its
fields are stored as, the relations), ``_planning`` (how both accountants walk a
``DpEvent`` tree and check what dp-accounting does not), ``_rdp``
(``LastIterateAccountant``), ``_gdp`` (one run certified mu-GDP) and ``_pld``
(``LastIteratePldAccountant``). They use the public package and the host contract
(:mod:`lastiter_plugins.host`), never the core's inner modules.
"""

# NeighboringRelation (the host's relation enum), UpdateRule (the event's update enum) and
# CompositionErrorDetails are importable from here too, as before the split (not in __all__).
from lastiter_plugins.adapters.dp_accounting._events import BoundId, LastIterateDpSgdEvent, SamplingScheme
from lastiter_plugins.adapters.dp_accounting._events import NeighboringRelation as NeighboringRelation
from lastiter_plugins.adapters.dp_accounting._events import UpdateRule as UpdateRule
from lastiter_plugins.adapters.dp_accounting._planning import CompositionErrorDetails as CompositionErrorDetails
from lastiter_plugins.adapters.dp_accounting._pld import LastIteratePldAccountant
from lastiter_plugins.adapters.dp_accounting._rdp import LastIterateAccountant

__all__ = [
    "BoundId",
    "LastIterateAccountant",
    "LastIterateDpSgdEvent",
    "LastIteratePldAccountant",
    "SamplingScheme",
]
