r"""What a jax_privacy run gets, for people: the pipeline observed, the epsilon with its relation, sampling, proof
status and what it covers, the rows that left and why, and jax_privacy's own number beside it (NOT VALID where
its sampling assumption fails). Shared by the Keras route and the JAX API."""

from __future__ import annotations

import dataclasses

from lastiter_plugins.host import Account, HostNumber

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
        cfg, result = self.account.config, self.account.result
        rate = "unknown" if cfg.learning_rate is None else f"{cfg.learning_rate:.6g}"
        update = "plain SGD" if cfg.update.value == "sgd" else "an update other than plain SGD"
        proof = str(result.proof) + ("" if result.published else f", {result.provenance}")
        out = [
            f"run: {self.how}; n = {cfg.dataset_size}, b = {cfg.batch_size}, "
            f"noise multiplier {cfg.noise_multiplier:.6g}, clip {cfg.clip_norm:.6g}, {update} at learning rate "
            f"{rate}; {self.steps} steps observed, {cfg.steps} accounted",
            f"epsilon = {result.epsilon:.4g} at delta = {result.delta:.3g} ({result.relation.value}, "
            f"{result.sampling.value}; covers {result.protects.value}; {result.winner}: {proof})",
        ]
        if self.note:
            out.append(f"  every iterate only: {self.note}")
        out += [f"  {row}" for row in self.account.rows_left]
        if self.host is not None:
            out.append(f"jax_privacy's own number: {self.host}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())
