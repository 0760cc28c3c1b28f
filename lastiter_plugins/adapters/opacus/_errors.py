"""The Opacus adapter's errors (``lastiter_plugins.NotApplicableError`` and ``PipelineChangedError``)."""

from __future__ import annotations

import lastiter_plugins as lp


class LastIterateConfigurationError(lp.NotApplicableError):
    """The Opacus pipeline does not match what the registered bound assumes
    (found at ``make_private`` or when binding a loader).

    The message names the parameter, the constraint, the value found and the fix.
    """


class LastIteratePipelineChangedError(LastIterateConfigurationError, lp.PipelineChangedError):
    """What an optimizer step actually did breaks every row (data source, sampler, batch, per-example
    gradients, noise, clipping, parameters written outside the step), or the bound the user named. The
    run's epsilon is void from then on."""
