r"""The TF Privacy adapter's refusal."""

from __future__ import annotations

from lastiter_plugins import NotApplicableError


class AccountingError(NotApplicableError):
    """The training run cannot be accounted (the message names the setting and the fix)."""
