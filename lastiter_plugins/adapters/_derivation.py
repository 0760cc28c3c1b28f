"""Derive the pipeline that ran from what a run monitor observed, and compare it with what is accounted.

Shared by the host adapters; it imports no host library. A host's monitor observes, for every noisy
step, the logical batch the step used (the dataset indices its sampler drew, see
:class:`DrawnBatch`) and the number of per-example clipped gradients the step summed, and hands them
to :meth:`Derivation.check_step`. The derivation refuses a step (returns the reason) when what ran is
not what is accounted (docs/derivations/opacus-adapter.md#run-monitor):

* exactly one drawn logical batch per noisy step, and one clipped gradient per example in it
  (duplicated rows, concatenated batches and merged skipped steps sum more gradients than that);
* the epoch schemes (cyclic, shuffle_once, reshuffle): each pass of the sampler is a permutation of the
  n examples, used whole (a pass that broke off, then a new one, is refused), batches in the order
  drawn; cyclic and shuffle_once: every pass equal to the first; reshuffle: no pass equal to an
  earlier one (one permutation reused with a public seed is cyclic, not reshuffle);
* Poisson: no pass of batches equal to an earlier pass (a generator re-seeded with the same seed
  every epoch draws the same batches: not independent Poisson draws), and no batch delivered to the loop
  and used by no step before the step's batch (choosing among drawn batches is not Poisson sampling).

What cannot be observed (that a seed is secret, the data behind the indices) stays a precondition of
the host's documentation. Where a pass must equal the first (cyclic, shuffle_once) the batches are compared
exactly: the first pass is kept whole, and a later pass equal to it position by position is a permutation
too. Where a pass must differ from every earlier one (reshuffle, Poisson), 64-bit hashes of the index tuples
are compared: a collision can only refuse a genuine run (never accept a wrong one), with probability about
2^-64 per comparison.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import lastiter_plugins as lp

Sampling = lp.Sampling
_EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
_FIXED_ORDER = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE)  # every pass equal to the first
#: A prefix of a pass equal to an earlier pass's is refused once a genuine draw of the declared law would
#: repeat it with probability below 2^-EVIDENCE_BITS (a complete pass equal to an earlier one always is).
EVIDENCE_BITS = 40.0


@dataclasses.dataclass(frozen=True)
class DrawnBatch:
    """One logical batch as the sampler drew it: ``pass_id`` numbers the iterations of a recorded sampler
    (one per epoch of the loader, globally increasing), ``position`` is its place in that pass."""

    pass_id: int
    position: int
    indices: tuple[int, ...]


@dataclasses.dataclass
class _Pass:
    pass_id: int
    hashes: list[int]  # per position: hash of the batch's index tuple
    size: int  # indices consumed so far
    seen: np.ndarray | None  # epoch schemes, until a pass is compared exactly: which examples it has used
    batches: list[tuple[int, ...]] | None = None  # cyclic, shuffle_once: the first pass, kept whole


class Derivation:
    """The index stream of a run, step by step, against the declared sampling scheme.

    Args:
      sampling: the declared scheme.
      dataset_size: n.
      batches_per_pass: batches in one pass of the sampler (``len(loader)``).
      sample_rate: Poisson's q (None for the epoch schemes).
    """

    def __init__(self, sampling: Sampling, dataset_size: int, batches_per_pass: int, sample_rate: float | None):
        self.sampling = sampling
        self.n = int(dataset_size)
        self.batches_per_pass = int(batches_per_pass)
        self.sample_rate = sample_rate
        self.steps = 0
        self._passes: list[_Pass] = []  # complete or interrupted passes before the current one
        self._current: _Pass | None = None
        self._candidates: list[_Pass] = []  # earlier passes equal to the current one so far
        self._resumed: _Pass | None = None  # a fixed-order pass a checkpoint saved part of, to be continued

    # -- the step
    def check_step(self, batch: DrawnBatch | None, gradients: int, unused: DrawnBatch | None = None) -> str | None:
        """Whether noisy step ``steps + 1``, which summed ``gradients`` per-example clipped gradients, used
        ``batch`` as the declared scheme says: None when it did (the step is recorded), else the reason.
        ``unused``: a batch the loader delivered to the loop before ``batch`` and no step used (of its pass,
        or of an earlier pass that a step used or that broke off; the monitor's finding), or None."""
        step = self.steps + 1
        if batch is None:
            return (
                f"every noisy step must use one batch drawn by the sampler of the data loader bound at make_private. "
                f"Found step {step} with no batch drawn from it since the previous step: the loop iterates another "
                "loader (the loader passed to make_private instead of the one it returned, a new DataLoader, a "
                "hand-made batch). Iterate the loader make_private returned"
            )
        size = len(batch.indices)
        if gradients != size:
            return (
                f"each example of a step's batch must contribute exactly one clipped gradient (the sensitivity of "
                f"the clipped sum is one clipping norm per example, as every bound assumes): the batch drawn for "
                f"step {step} holds {size} examples. Found {gradients} per-example gradients summed. More: examples "
                "repeated or added (a collate_fn or loss producing several rows per example, two loader batches "
                "concatenated, several batches merged into one step with signal_skip_step); fewer: a cut batch. "
                "Feed each loader batch once, whole, to the private module, and take one optimizer step per batch"
            )
        if size and (min(batch.indices) < 0 or max(batch.indices) >= self.n):
            return f"the indices of a batch must lie in [0, {self.n}). Found {min(batch.indices)}..{max(batch.indices)}"
        if len(set(batch.indices)) != size:
            return (
                f"a batch must hold each example at most once. Found the batch of step {step} with "
                f"{size - len(set(batch.indices))} repeated indices (a sampler with replacement)"
            )
        if unused is not None and self.sampling is Sampling.POISSON:
            where = "of its pass" if unused.pass_id == batch.pass_id else "of an earlier pass"
            return (
                f"a Poisson batch delivered to the loop and not used by a step, then a later batch used: choosing "
                f"among drawn batches loses the amplification by subsampling every Poisson bound assumes. Found "
                f"step {step} using batch {batch.position + 1} of its pass while batch {unused.position + 1} {where} "
                f"({len(unused.indices)} examples), delivered before it, was used by no step (a loop that skips "
                "batches, redraws them, or breaks off a pass after receiving a batch it does not train on). Use "
                "every batch the loader yields, e.g. itertools.islice(loader, K) to stop early without drawing an "
                "extra batch"
            )
        problem = self._enter(batch, step)
        if problem is None:
            problem = self._compare(batch, step)
        if problem is None:
            self.steps = step
        return problem

    def _enter(self, batch: DrawnBatch, step: int) -> str | None:
        """Start a pass or continue the current one (the batch is not recorded yet)."""
        current = self._current
        epochs = self.sampling in _EPOCH_SCHEMES
        resumed, self._resumed = self._resumed, None
        if current is None and resumed is not None:
            done = len(resumed.hashes)
            if batch.position != done:
                self._resumed = resumed  # (the step is refused; a later one may still continue the pass)
                return (
                    f"a run with sampling={self.sampling.value} must resume at an epoch boundary or continue the "
                    f"interrupted pass: it assumes whole passes over the data, every batch in order. Found the first "
                    f"step after the checkpoint using batch {batch.position + 1} of a pass, where the checkpoint was "
                    f"saved after {done} of its {self.batches_per_pass} batches: continue that pass by skipping "
                    f"exactly those (itertools.islice(loader, {done}, None)) before a new one"
                )
            # the first step after a checkpoint saved mid-pass continues that pass at the next position
            order = (self._passes[0].batches if self._passes else resumed.batches) or []
            size = sum(len(b) for b in order[:done])
            seen = None
            if not self._passes:  # (the first pass: checked to be a permutation, as it is not compared)
                seen = np.zeros(self.n, dtype=bool)
                for b in order[:done]:
                    seen[np.asarray(b, dtype=np.int64)] = True
            self._current = dataclasses.replace(resumed, pass_id=batch.pass_id, size=size, seen=seen)
            return None
        if current is None or batch.pass_id != current.pass_id:
            if current is not None and epochs:
                done = len(current.hashes)
                if done != self.batches_per_pass or current.size != self.n:
                    return (
                        f"sampling={self.sampling.value} assumes whole passes over the data: each epoch uses every "
                        f"batch of one pass of the loader, once. Found a new pass of the loader started at step "
                        f"{step} after the previous pass used {done} of its {self.batches_per_pass} batches "
                        f"({current.size} of {self.n} examples): a loop that broke out of an epoch, skipped a "
                        "batch, or a loader re-created mid-epoch. Let every epoch run to its end"
                    )
            if epochs and batch.position != 0:
                return (
                    f"sampling={self.sampling.value} assumes whole passes over the data. Found step {step} using "
                    f"batch {batch.position + 1} of a pass whose first batches no step used"
                )
            if current is not None:
                current.seen = None  # (only the current pass needs it)
                self._passes.append(current)
            fixed, first = self.sampling in _FIXED_ORDER, not self._passes
            seen = np.zeros(self.n, dtype=bool) if epochs and (first or not fixed) else None
            self._current = _Pass(batch.pass_id, [], 0, seen, [] if fixed and first else None)
            self._candidates = [p for p in self._passes if p.hashes]
            return None
        if epochs and batch.position != len(current.hashes):
            return (
                f"sampling={self.sampling.value} assumes each epoch uses the batches of a pass in the order drawn, "
                f"each once. Found step {step} using batch {batch.position + 1} of its pass after "
                f"{len(current.hashes)} steps of that pass: batch {len(current.hashes) + 1} was drawn and not "
                "used by a step (a loop that skips batches, or two batches fed to one step)"
            )
        return None

    def _compare(self, batch: DrawnBatch, step: int) -> str | None:
        current, key = self._current, hash(batch.indices)
        assert current is not None  # _enter started or continued a pass
        position = len(current.hashes)
        if current.seen is not None and batch.indices:
            rows = np.fromiter(batch.indices, dtype=np.int64, count=len(batch.indices))
            if current.seen[rows].any():
                return (
                    f"sampling={self.sampling.value} assumes each pass is a permutation of the data. Found step "
                    f"{step} using an example its pass had already used"
                )
            current.seen[rows] = True
        if self.sampling in _FIXED_ORDER and self._passes:
            first = self._passes[0].batches
            if first is None or position >= len(first) or first[position] != batch.indices:
                return (
                    f"sampling={self.sampling.value} assumes one order of the data for the whole run, every epoch "
                    f"the same batches. Found batch {position + 1} of epoch {len(self._passes) + 1} (step {step}) "
                    "different from the first epoch's: the loader reshuffles (declare sampling='reshuffle' with "
                    "DataLoader(shuffle=True)), or another sampler or permutation was used"
                )
        current.hashes.append(key)
        if current.batches is not None:
            current.batches.append(batch.indices)
        current.size += len(batch.indices)
        if self.sampling in (Sampling.RESHUFFLE, Sampling.POISSON) and self._candidates:
            self._candidates = [p for p in self._candidates if position < len(p.hashes) and p.hashes[position] == key]
            if self._candidates and self._repeat_is_evident(current):
                return self._repeated(step)
        return None

    def _repeat_is_evident(self, current: _Pass) -> bool:
        """Whether the current pass, equal so far to an earlier one, is beyond chance for the declared law."""
        if self.sampling is Sampling.RESHUFFLE:
            if current.size >= self.n:
                return True
            # probability that a fresh permutation starts with these m indices: 1 / (n (n-1) ... (n-m+1))
            bits = (math.lgamma(self.n + 1) - math.lgamma(self.n - current.size + 1)) / math.log(2)
            return bits >= EVIDENCE_BITS
        if len(current.hashes) >= self.batches_per_pass:
            return True
        assert self.sample_rate is not None  # Poisson (the only other scheme checked for repeats) has its rate
        q = float(self.sample_rate)
        same = q * q + (1.0 - q) * (1.0 - q)  # one example, one step: the two draws agree
        bits = -len(current.hashes) * self.n * math.log2(same) if same < 1.0 else 0.0
        return bits >= EVIDENCE_BITS

    def _repeated(self, step: int) -> str:
        if self.sampling is Sampling.RESHUFFLE:
            return (
                "sampling='reshuffle' assumes a fresh secret permutation every epoch. Found the permutation of the "
                f"epoch running at step {step} equal to an earlier epoch's: a generator or torch.manual_seed "
                "re-seeded with the same seed every epoch reuses one permutation with a public seed, which is "
                "sampling='cyclic' (a fixed public order). Seed once, before training, or declare cyclic with "
                "DataLoader(shuffle=False)"
            )
        return (
            "sampling='poisson' assumes independent batches at every step. Found the batches of the pass running at "
            f"step {step} equal to an earlier pass's: the sampler's generator is re-seeded with the same seed every "
            "epoch, so the batches repeat. Seed the generator once, before training (or leave it to "
            "make_private)"
        )

    # -- checkpoints
    def state(self) -> dict:
        """What a resumed run must be compared with: the steps, every pass' batch hashes (64-bit) and, for
        cyclic and shuffle_once, the first pass' batches."""
        passes = [*self._passes, *([self._current] if self._current is not None else [])]
        state: dict = {"steps": self.steps, "passes": [list(p.hashes) for p in passes]}
        if passes and passes[0].batches is not None:
            state["first"] = [list(b) for b in passes[0].batches]
        return state

    def restore(self, state: dict) -> None:
        """Continue the record of a checkpoint (``state()``): the passes before it are the earlier passes
        the resumed ones are compared with; the resumed loader starts a new pass."""
        self.steps = int(state["steps"])
        self._passes = [_Pass(-1, [int(h) for h in hashes], 0, None) for hashes in state["passes"]]
        if self._passes and self.sampling in _FIXED_ORDER:
            if "first" not in state:
                raise ValueError(
                    f"sampling={self.sampling.value}: the saved record has no first pass to compare the resumed "
                    "epochs with (a checkpoint from an earlier version of this adapter). Resume from a checkpoint "
                    "this version saved"
                )
            self._passes[0].batches = [tuple(int(i) for i in b) for b in state["first"]]
        self._current, self._candidates = None, []
        # a fixed order saved mid-pass: the resumed run may continue that pass where it stopped (the batches
        # before are the saved ones: the loop skips them, e.g. itertools.islice(loader, done, None))
        self._resumed = None
        if self._passes and self.sampling in _FIXED_ORDER and len(self._passes[-1].hashes) < self.batches_per_pass:
            self._resumed = self._passes.pop()
            if not self._passes:  # (the first pass itself: its saved batches are the order to continue)
                self._resumed.batches = [tuple(int(i) for i in b) for b in state["first"]]

    @property
    def continues_a_pass(self) -> bool:
        """A fixed-order run resumed from a checkpoint saved mid-pass, before its first step: the derivation
        decides whether the step continues that pass."""
        return self._resumed is not None

    # -- what the record shows
    @property
    def passes(self) -> int:
        """Passes of the sampler that steps used so far."""
        return len(self._passes) + (self._current is not None)
