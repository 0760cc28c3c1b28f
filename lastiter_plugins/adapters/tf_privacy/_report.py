r"""What the Keras adapter tells the user about a run: first the answer (:func:`lastiter_plugins.answer_lines`: the
valid number for the pipeline that ran, what it protects, its relation, sampling, winning row and provenance,
TF Privacy's own numbers NOT VALID where their assumptions fail), then the rows that left ``best`` on the way
(at which step, why), and what TF Privacy's own statement would print for the run, marked NOT VALID where its
assumptions fail, with the ratio of the valid number to it (as ``lastiter compare`` shows it)."""

from __future__ import annotations

import dataclasses
import math
import textwrap

import lastiter_plugins as lp
from lastiter_plugins.host import Departure, HostNumber, RowLeft, answer, host_numbers

from ._allocation_input import RandomAllocationDataset

#: TF Privacy's accountant whose number the callback's logs carry beside ``epsilon``: its Poisson line, the one
#: its statement says "the actual epsilon should be closer to" for shuffled data.
LOGGED = "tf-privacy-poisson"


@dataclasses.dataclass(frozen=True)
class Report:
    """The valid number for the run, what left ``best``, and TF Privacy's own numbers beside it.

    Attributes:
      result: the valid epsilon for the pipeline that ran (``str(result)`` renders it alone).
      rows_left: the rows that applied as declared and left ``best`` (step, fact, first broken precondition).
      host: what TF Privacy's ``compute_dp_sgd_privacy_statement`` prints for the run (display only).
      departures: every fact that weakened the pipeline (also those with which no row left: a schedule after
        Adam, a departure on a pipeline where only the every-iterate rows applied).
      answer: the first screen (:func:`lastiter_plugins.answer_lines`; empty: ``str(result)`` stands for it).
      run_notes: what the input did beyond the scheme (a RandomAllocationDataset's padding and cuts).
    """

    result: lp.EpsilonResult
    rows_left: tuple[RowLeft, ...] = ()
    host: tuple[HostNumber, ...] = ()
    departures: tuple[Departure, ...] = ()
    answer: tuple[str, ...] = ()
    run_notes: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        result: lp.EpsilonResult,
        config: lp.TrainingConfig,
        rows_left: tuple[RowLeft, ...] = (),
        departures: tuple[Departure, ...] = (),
        assumptions: lp.LossAssumptions | None = None,
        orders: tuple[float, ...] | None = None,
    ) -> Report:
        hosts = host_numbers(config, result.delta, "tf_privacy")
        first = answer(result, config, assumptions or lp.LossAssumptions(), "tf_privacy", orders)
        return cls(result, rows_left, hosts, departures, tuple(lp.answer_lines(first)))

    def ratio(self, number: HostNumber) -> float | None:
        """The valid epsilon over the host's (None when the host gave none)."""
        if number.epsilon is None:
            return None
        return self.result.epsilon / number.epsilon if number.epsilon > 0 else math.inf

    def logs(self) -> dict[str, float]:
        """What the callback writes into fit's epoch logs: ``epsilon``, TF Privacy's Poisson number (under a key
        ending in ``_not_valid`` where its assumptions fail) and the ratio of the two."""
        out = {"epsilon": self.result.epsilon}
        for number in self.host:
            ratio = self.ratio(number)
            if number.id != LOGGED or ratio is None or number.epsilon is None:
                continue
            out["tf_privacy_epsilon" if number.valid else "tf_privacy_epsilon_not_valid"] = number.epsilon
            out["epsilon_over_tf_privacy"] = ratio
        return out

    def lines(self) -> list[str]:
        """The answer first, then the run, the rows that left ``best`` (step, fact), the departures with which
        no row left, and TF Privacy's numbers with the ratio of the valid number to each."""
        r = self.result
        details = [f"Run: sampling {r.sampling.value}, {r.steps} steps.", *self.run_notes]
        details += [f"left best: {row}" for row in self.rows_left]
        named = {(row.step, row.fact) for row in self.rows_left}
        details += [
            f"observed at step {d.step}: {d.fact} (no further row left with it)"
            for d in self.departures
            if (d.step, d.fact) not in named
        ]
        lines = list(self.answer) or str(r).split("\n")
        lines += [wrapped for line in details for wrapped in _wrap(line, "  ")]
        if self.host:
            lines.append("What TF Privacy's compute_dp_sgd_privacy_statement prints for this run (never counted):")
            for number in self.host:
                ratio = self.ratio(number)
                times = "" if ratio is None else f"; the valid epsilon is {ratio:.3g}x it"
                lines += _wrap(f"{number}{times}", "  ")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


def padding_note(allocation: RandomAllocationDataset, cut: int) -> str:
    """What a RandomAllocationDataset did beyond random allocation: the padding (TF Privacy's divisor) and the
    ``cut`` batches of the run."""
    L, b = allocation.max_batch_size, allocation.batch_size
    return (
        f"Every batch padded to {L} rows with sample weight 0: TF Privacy divides each step's noisy sum by {L} (the "
        f"step of an example is learning_rate / {L}), and each step computes {L / b:.2f}x the rows of a mean batch "
        f"of {b}; {cut} batch{'' if cut == 1 else 'es'} had more than {L} examples and {'was' if cut == 1 else 'were'} "
        "cut (the delta carries that probability)."
    )


def _wrap(text: str, indent: str) -> list[str]:
    """``text`` in lines of at most 120 characters (the answer's width), continued four spaces further in."""
    return textwrap.wrap(
        text, 120, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False,
        break_long_words=False,
    )  # fmt: skip
