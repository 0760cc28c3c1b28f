"""The generators a run draws from, where their seeds can be seen (docs/derivations/public-order.md#public-order).

* The sampling generator (a reshuffling loader's, which Opacus' Poisson loader takes from the user's loader when
  ``make_private`` is given none; torch's global generator when there is none): in torch's fixed fresh state (a
  ``torch.Generator()`` never seeded starts at seed 67280421310721) or re-seeded between passes
  (``torch.manual_seed(epoch)`` before each epoch), the order or the batches are public: a departure
  ``order_secret=False`` (gates the rows whose proof needs them secret).
* The noise generator (``make_private(noise_generator=...)``): in the fixed fresh state or seeded by the script,
  the noise can be regenerated and no row holds: refused at ``make_private`` (:func:`public_noise`).
* A generator the script seeded once (``torch.manual_seed(0)`` at the top of a script): a line of the report
  (:func:`seed_notes`): its seed must be kept secret.

"Seeded by the script" is read from ``initial_seed()``: torch seeds its global generator at start-up (and
``Generator.seed()``) with a random 64-bit number, so a seed below 2**32 was chosen by a person (a random seed
lands there with probability 2**-32).
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _patches as patches
from lastiter_plugins.adapters.opacus._allocation_sampler import RandomAllocationSampler
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._loaders import POISSON_SAMPLERS, LoaderFacts
from lastiter_plugins.host import Departure

#: the seed of every ``torch.Generator()`` never seeded (torch's ``default_rng_seed_val``)
FRESH_SEED = torch.Generator().initial_seed()
#: seeds below this were chosen by a person: torch's own seeds are random 64-bit numbers
CHOSEN_SEEDS = 2**32


def seeded(generator: torch.Generator) -> str | None:
    """How ``generator``'s seed can be known: its fixed fresh state, a seed the script chose, or None."""
    seed = generator.initial_seed()
    if seed == FRESH_SEED:
        return f"is in torch's fixed fresh state (a torch.Generator() never seeded starts at seed {FRESH_SEED})"
    if seed < CHOSEN_SEEDS:
        return f"was seeded by the script (initial_seed() = {seed}; torch's own seeds are random 64-bit numbers)"
    return None


def sampling_generator(loader: Any) -> tuple[torch.Generator, str] | None:
    """The generator the loader's batches are drawn from, in words; None for a loader that draws nothing
    (cyclic) or draws from its own seed (``ShuffleOnceSampler``, whose seed is secret by default)."""
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, POISSON_SAMPLERS):
        generator, where = batch_sampler.generator, "the Poisson sampler's generator (the data loader's generator)"
    elif type(batch_sampler) is BatchSampler and type(batch_sampler.sampler) is RandomSampler:
        generator, where = batch_sampler.sampler.generator, "the data loader's generator (DataLoader(generator=...))"
    elif type(batch_sampler) is RandomAllocationSampler and isinstance(batch_sampler.generator, torch.Generator):
        generator, where = batch_sampler.generator, "the RandomAllocationSampler's generator"
    else:
        return None  # (a RandomAllocationSampler's numpy generator: its seed is not read)
    if generator is None:
        return torch.default_generator, "torch's global generator (the data loader has none)"
    return generator, where


def public_noise(optim: Any) -> str | None:
    """Why the noise ``optim`` adds can be regenerated (``make_private(noise_generator=...)`` in the fixed fresh
    state or seeded by the script), else None."""
    generator = getattr(optim, "generator", None)
    how = None if generator is None else seeded(generator)
    if how is None:
        return None
    return (
        "the noise must be drawn from a secret seed: every bound assumes the adversary cannot regenerate it. Found "
        f"make_private(noise_generator=...) whose generator {how}: whoever knows the script subtracts the noise, "
        "and no bound holds. Leave noise_generator out (torch's global generator, seeded at random when the "
        "process starts), or seed it with a secret 64-bit number (secrets.randbits(64)) that you keep"
    )


def refuse_public_noise(optim: Any) -> None:
    why = public_noise(optim)
    if why is not None:
        raise LastIterateConfigurationError(f"{why}.")


def seed_notes(sampling: tuple[torch.Generator, str] | None) -> tuple[str, ...]:
    """The report's lines on seeds the script chose once: the loader's sampling generator's (``sampling``: the
    generator and its name, None when the loader draws nothing) and the global generator's (the noise, and the
    sampling where the loader has no generator of its own)."""
    notes = []
    if sampling is not None and sampling[0] is not torch.default_generator:
        seed = sampling[0].initial_seed()
        if seed != FRESH_SEED and seed < CHOSEN_SEEDS:  # (the fresh state is a departure)
            notes.append(
                f"{sampling[1]} {seeded(sampling[0])}: the {'batches' if 'Poisson' in sampling[1] else 'order'} "
                "is secret only while that seed is; keep it secret, or the order is public and fewer rows hold"
            )
    if torch.initial_seed() < CHOSEN_SEEDS:
        notes.append(
            f"torch's global generator was seeded by the script (torch.initial_seed() = {torch.initial_seed()}): the "
            "noise (and the sampling, where it draws from it) can be regenerated by whoever knows the seed, and "
            "then no bound holds; keep the seed secret (torch seeds itself at random when the script seeds nothing)"
        )
    return tuple(notes)


class SamplingGenerator(Check):
    """The generator the bound loader draws its batches from, at the start of every pass: in torch's fixed fresh
    state, or re-seeded since the previous pass (its seed changed, or it is back in a state a pass already started
    from), the order or the batches are public (a departure, ``order_secret=False``)."""

    gates = "order_secret"
    __slots__ = ("_generator", "_noun", "_public", "_reported", "_seed", "_states", "_where")

    def __init__(self, loader: Any, facts: LoaderFacts) -> None:
        found = sampling_generator(loader)
        self._generator = None if found is None else weakref.ref(found[0])
        self._where = "" if found is None else found[1]
        self._noun = "order" if facts.sampling is lp.Sampling.RESHUFFLE else "batches"
        self._seed: int | None = None
        self._states: set[str] = set()
        self._public: str | None = None
        self._reported = False
        if found is not None:
            patches.record_pass_starts(loader.batch_sampler, self._pass_started)

    def adopted(self, batch_sampler: Any) -> None:
        """A batch sampler the run adopted (a loader built later over the bound dataset): its generator is the
        one its passes draw from from now on."""
        if type(batch_sampler.sampler) is not RandomSampler:
            return  # (a fixed order draws nothing)
        generator = batch_sampler.sampler.generator
        self._generator = weakref.ref(generator if generator is not None else torch.default_generator)
        if generator is not None:
            self._where = "the generator of a data loader built after make_private"
        patches.record_pass_starts(batch_sampler, self._pass_started)

    def _pass_started(self, pass_id: int) -> None:
        generator = None if self._generator is None else self._generator()
        if generator is None or self._public is not None:
            return
        seed = generator.initial_seed()
        state = hashlib.sha256(generator.get_state().numpy().tobytes()).hexdigest()
        if seed == FRESH_SEED:
            self._public = f"{self._where} {seeded(generator)}"
        elif self._seed is not None and seed != self._seed:
            self._public = f"{self._where} was re-seeded between passes (initial_seed() {self._seed} -> {seed})"
        elif state in self._states:
            self._public = (
                f"{self._where} was re-seeded between passes: a pass started from the state an earlier pass started "
                "from (the same seed set before each pass)"
            )
        self._seed = seed
        self._states.add(state)

    def notes(self) -> tuple[str, ...]:
        """The report's lines on seeds the script chose (:func:`seed_notes`)."""
        generator = None if self._generator is None else self._generator()
        return seed_notes(None if generator is None else (generator, self._where))

    def at_step(self, step: Step) -> Departure | None:
        if self._public is None or self._reported:
            return None
        self._reported = True
        return Departure(
            step.number,
            f"{self._public}: the {self._noun} can be regenerated by whoever knows the script",
            {"order_secret": False},
        )
