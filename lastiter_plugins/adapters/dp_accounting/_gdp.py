r"""One last-iterate run certified mu-GDP, for composing it as a Gaussian mechanism.

:func:`gaussian_mu` is the mu of a run certified mu-GDP (a GDP bound whose profile has one
component), for dp-accounting's PLD accountant. ``best``'s rows come from its one candidate set and a
GDP row's mus from its privacy profile, both through the host contract (:func:`lastiter_plugins.host.rows`,
:func:`~lastiter_plugins.host.gaussian_mus`).
"""

from __future__ import annotations

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.config import LossAssumptions, TrainingConfig
from lastiter_plugins.errors import NotApplicableError


def gaussian_mu(bound: str, config: TrainingConfig, assumptions: LossAssumptions) -> tuple[float, str]:
    r"""(mu, bound id): the run is mu-GDP for ``config.relation`` by that bound.

    A GDP bound whose privacy profile has a single component certifies that the
    run's output pair is a post-processing of :math:`(\mathcal N(0,1), \mathcal N(\mu,1))`
    (Dong, Roth & Su 2019, arXiv 1905.02383): it is dominated by a Gaussian
    mechanism of sensitivity 1 and noise :math:`1/\mu`, and composes as one.
    ``best``: the smallest mu over the proven mu-GDP bounds that apply (a
    smaller mu is a stronger guarantee at every delta).

    Raises:
      NotApplicableError: no such bound; the message says why (a Renyi-DP
        bound, a mixture profile, or no mu-GDP bound applies).
    """
    found: list[tuple[float, str]] = []
    mixtures: list[str] = []
    for spec in host.rows(bound, config, assumptions):
        if spec.kind is not lp.Kind.GDP:
            continue
        mus = host.gaussian_mus(spec, config, assumptions)
        if len(mus) == 1:  # one Gaussian is mu-GDP; a mixture, or a profile that is none (Poisson), is not one
            found.append((mus[0], spec.id))
        else:
            mixtures.append(spec.id)
    if found:
        return min(found)
    use = "Use LastIterateAccountant (Renyi DP) for this run"
    if mixtures and bound != lp.BEST:
        raise NotApplicableError(
            f"{bound} certifies a mixture of Gaussian privacy profiles (one component per position of the "
            "differing example), not one Gaussian, so it cannot be composed as a Gaussian mechanism. "
            "shifted-interpolation-cyclic also covers shuffle_once (the worst position: the mixture's largest "
            f"component) and is one Gaussian. {use}, which composes the mixture's Renyi DP."
        )
    if bound != lp.BEST:
        raise NotApplicableError(
            f"{bound} is a Renyi-DP bound, not a mu-GDP one: only runs certified mu-GDP compose as Gaussian "
            f"mechanisms in the PLD accountant. {use}."
        )
    raise NotApplicableError(
        "no proven mu-GDP bound (one Gaussian privacy profile) applies to this run with sampling="
        f"{config.sampling.value}, relation={config.relation.value} (the f-DP bounds are "
        f"{', '.join(gdp_bound_ids())}, each with its own conditions, see {host.DOCS}; a mixture profile is not "
        f"one Gaussian). {use}."
    )


def gdp_bound_ids() -> tuple[str, ...]:
    """The ids of the GDP (privacy-profile) bounds of the table."""
    return tuple(spec.id for spec in lp.BOUNDS.values() if spec.kind is lp.Kind.GDP)
