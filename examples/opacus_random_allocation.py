r"""DP-SGD with random allocation (balls in bins) in Opacus: every example once per epoch, in a secret random step.

Runs on CPU in a few seconds::

    python examples/opacus_random_allocation.py [--epochs 3] [--noise 1.0] [--batch-size 50]

A shuffled loader (``DataLoader(shuffle=True)``) uses every example once per epoch, but its valid number has no
amplification by sampling; Opacus' default Poisson sampling has it but uses an example in no step, or several, of
an epoch. ``RandomAllocationSampler`` keeps the epochs and gets nearly Poisson's number: every epoch, each example
is put in one of the epoch's ``t = ceil(n / b)`` steps, drawn uniformly at random, secretly and afresh every epoch
(docs/sampling.md, "Random allocation"). Batch sizes vary around ``n / t`` and a batch may be empty (a step that
adds only the noise).

The accountant recognises the sampler, checks at every step that the batch trained is the one it drew (whole
epochs, each example once an epoch, a fresh allocation every epoch), and reports the random-allocation number
(every iterate, add-or-remove neighbours), beside the numbers Opacus' own accountants would print for this
loader (NOT VALID: they assume Poisson sampling).

The data are generated (two Gaussian classes in 20 dimensions); the model is a small MLP.
"""

from __future__ import annotations

import argparse
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import TensorDataset

import lastiter_plugins as lp
from lastiter_plugins.adapters import opacus as lastiter_opacus

DELTA = 1e-5


def make_data(n: int, dim: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=gen) < 0.5).long()
    x = torch.randn(n, dim, generator=gen) + 0.5 * (2 * y[:, None] - 1)
    return TensorDataset(x, y)


def main(epochs: int = 3, noise: float = 1.0, batch_size: int = 50, train_size: int = 1000) -> dict:
    """Train, print the accountant's number beside Opacus' and the shuffled loader's, return them."""
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*full backward hook")
    torch.manual_seed(0)
    torch.set_num_threads(1)

    data = make_data(train_size, 20, seed=0)
    n = len(data)
    name = lastiter_opacus.register("random-allocation-mlp", force=True, sampling="random_allocation", dataset_size=n)
    engine = PrivacyEngine()
    lastiter_opacus.attach(engine, name)  # on Opacus 1.6 also: PrivacyEngine(accountant=name)
    sampler = lastiter_opacus.RandomAllocationSampler(n, batch_size)  # secret generator, fresh every epoch
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=sampler.data_loader(data),  # DataLoader(data, batch_sampler=sampler), empty batches collated
        noise_multiplier=noise,
        max_grad_norm=1.0,
        poisson_sampling=False,
    )
    print(
        f"n={n}, b={batch_size}: {len(loader)} steps an epoch, each example in one of them; Opacus divides by "
        f"expected_batch_size={optimizer.expected_batch_size}; z={noise}, {epochs} epochs"
    )
    loss_fn = nn.CrossEntropyLoss()
    sizes: list[int] = []  # (the batch sizes are secret: a real run would not print them)
    for epoch in range(1, epochs + 1):
        for x, y in loader:  # every batch, the empty ones too: one optimizer step each
            sizes.append(len(y))
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        print(f"epoch {epoch}: {engine.accountant.steps} steps so far, {sum(sizes)} examples used")
    epsilon = engine.get_epsilon(DELTA)
    report = engine.accountant.report(DELTA)
    print(report)  # the answer first: the number, its row and provenance, Opacus' own numbers (NOT VALID here)
    shuffled = lp.epsilon(
        lp.BEST, dataset_size=n, batch_size=batch_size, noise_multiplier=noise,
        steps=engine.accountant.steps, sampling="reshuffle", delta=DELTA,
    )  # fmt: skip
    print(f"the same run with DataLoader(shuffle=True): {shuffled}")
    return {"epsilon": epsilon, "report": report, "sizes": sizes, "shuffled": shuffled.epsilon}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--noise", type=float, default=1.0, help="noise multiplier z")
    parser.add_argument("--batch-size", type=int, default=50, help="b: an epoch is ceil(n / b) steps")
    args = parser.parse_args()
    main(args.epochs, args.noise, args.batch_size)
