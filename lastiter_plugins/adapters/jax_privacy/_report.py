r"""What a jax_privacy run gets, for people: first the answer (:func:`lastiter_plugins.answer_lines`: the epsilon,
what it covers, its relation, sampling, winning row and provenance, jax_privacy's own numbers NOT VALID where
their sampling assumption fails), then the pipeline observed and the rows that left and why. Shared by the
Keras route and the JAX API."""

from __future__ import annotations

import dataclasses
import textwrap

import lastiter_plugins as lp
from lastiter_plugins.host import Account, HostNumber, answer

#: The ids of jax_privacy's accountants among compare's host accountants (lastiter_plugins/compare/hosts.py).
HOST_POISSON = "jax-privacy-poisson"
HOST_FIXED_BATCH = "jax-privacy-fixed-batch"


@dataclasses.dataclass(frozen=True)
class Report:
    """One run's numbers (``str(report)`` is the text).

    Attributes:
      account: the number for the pipeline that ran (:func:`lastiter_plugins.host.account`).
      how: what drew the batches, in words.
      host: jax_privacy's own number for the run (display only), or None.
      steps: the steps observed (physical steps on the Keras route).
      note: why only the every-iterate rows cover the run, where the mapping says so (empty otherwise).
    """

    account: Account
    how: str
    host: HostNumber | None
    steps: int
    note: str = ""

    @property
    def epsilon(self) -> float:
        return float(self.account.result.epsilon)

    def lines(self) -> list[str]:
        """The answer first, then the run observed, why only every-iterate rows cover it (if so), the rows that
        left ``best`` and jax_privacy's own number as the host prints it."""
        cfg, result = self.account.config, self.account.result
        rate = "unknown" if cfg.learning_rate is None else f"{cfg.learning_rate:.6g}"
        update = "plain SGD" if cfg.update.value == "sgd" else "an update other than plain SGD"
        first = answer(result, cfg, self.account.assumptions, "jax-privacy")
        run = (
            f"run: {self.how}; n = {cfg.dataset_size}, b = {cfg.batch_size}, noise multiplier "
            f"{cfg.noise_multiplier:.6g}, clip {cfg.clip_norm:.6g}, {update} at learning rate {rate}; {self.steps} "
            f"steps observed, {cfg.steps} accounted"
        )
        out = [*lp.answer_lines(first), *textwrap.wrap(run, 120, initial_indent="  ", subsequent_indent="    ")]
        if self.note:
            out.append(f"  every iterate only: {self.note}")
        out += [f"  {row}" for row in self.account.rows_left]
        if self.host is not None:
            out.append(f"jax_privacy's own number: {self.host}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())
