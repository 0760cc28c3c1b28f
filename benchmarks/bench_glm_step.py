"""CPU time per step of the GLM route against plain Opacus, on a 30-feature logistic regression.

Issue "adapters v4", item 7: two pipelines trained in the same process, in alternating blocks of
steps (A B, B A, ...), each block's CPU time (``time.process_time``, one torch thread) recorded:

* A: ``FeatureNormClip(1) -> nn.Linear(30, 1)``, BCEWithLogitsLoss, SGD(weight_decay=0.01), a
  shuffle-once loader of batch 32, Opacus' RDP accountant;
* B: the same with ``register(..., model="glm", loss="logistic", feature_norm=1.0)``;
* an A/A control beside it (A against a second A).

Prints the median over the blocks of B/A and of the control, with their spread.

    python benchmarks/bench_glm_step.py [--blocks 9] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")

D, B, BATCHES, LR = 30, 32, 20, 0.1


def _pipeline(accountant: str, data):
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from lastiter_plugins.adapters import opacus as lo

    torch.manual_seed(0)
    model = torch.nn.Sequential(lo.FeatureNormClip(1.0), torch.nn.Linear(D, 1))
    loss = torch.nn.BCEWithLogitsLoss()
    loader = DataLoader(data, batch_size=B, sampler=lo.ShuffleOnceSampler(data, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = PrivacyEngine(accountant=accountant).make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR, weight_decay=0.01),
            data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False, criterion=loss,
        )  # fmt: skip
    batches = iter(())

    def steps(k: int) -> float:
        nonlocal batches
        start = time.process_time()
        for _ in range(k):
            try:
                xb, yb = next(batches)
            except StopIteration:
                batches = iter(loader)
                xb, yb = next(batches)
            optimizer.zero_grad()
            loss(model(xb), yb).backward()
            optimizer.step()
        return time.process_time() - start

    return steps


def ratios(first: str, second: str, blocks: int, steps: int) -> list[float]:
    import torch
    from torch.utils.data import TensorDataset

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B * BATCHES, D, generator=gen)
    data = TensorDataset(x / x.norm(dim=1, keepdim=True), (torch.rand(B * BATCHES, 1, generator=gen) < 0.5).float())
    a, b = _pipeline(first, data), _pipeline(second, data)
    a(BATCHES), b(BATCHES)  # one epoch first: hooks registered, caches warm
    out = []
    for k in range(blocks):
        if k % 2:
            tb, ta = b(steps), a(steps)
        else:
            ta, tb = a(steps), b(steps)
        out.append(tb / ta)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    from lastiter_plugins.adapters import opacus as lo

    name = lo.register("bench-glm-30", sampling="shuffle_once", dataset_size=B * BATCHES, learning_rate=LR,
                       model="glm", loss="logistic", feature_norm=1.0, force=True)  # fmt: skip
    for label, pair in (("GLM route / Opacus RDP", ("rdp", name)), ("A/A control", ("rdp", "rdp"))):
        values = ratios(*pair, args.blocks, args.steps)
        print(f"{label}: median {statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}] "
              f"over {args.blocks} blocks of {args.steps} steps")  # fmt: skip


if __name__ == "__main__":
    main()
