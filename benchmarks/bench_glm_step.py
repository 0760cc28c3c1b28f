"""CPU time per step of the GLM route against plain Opacus, on two models users train.

Issue "adapters v4", item 7: two pipelines trained in the same process, in alternating blocks of
steps (A B, B A, ...), each block's CPU time (``time.process_time``, one torch thread) recorded:

* ``logistic-30``: ``FeatureNormClip(1) -> nn.Linear(30, 1)``, BCEWithLogitsLoss, SGD(weight_decay=0.01),
  a shuffle-once loader of batch 32 over 640 examples (goal: B/A <= 1.10);
* ``probe-512``: the linear probe users train on frozen embeddings, ``FeatureNormClip(1) ->
  nn.Linear(512, 10)``, CrossEntropyLoss (softmax: the GLM route's multinomial logistic), SGD(weight_decay=0.01),
  Poisson sampling of expected batch 256 over 20000 examples (goal: B/A <= 1.05);

A is Opacus' RDP accountant, B the same with ``register(..., model="glm", ...)``; an A/A control beside
each (A against a second A). Prints the median over the blocks of B/A and of the control, with their range.
``--optimizer adam`` (issue 37, item 5): both pipelines train with ``torch.optim.Adam``, and B registers the
declared route (no ``model="glm"``, which derives constants for plain SGD only): the adapter's cost on the
same small models when the update check departs at the first step.

    python benchmarks/bench_glm_step.py [--model logistic-30|probe-512|all] [--blocks 9] [--steps 200]
        [--optimizer sgd|adam] [--quick]

Writes the ``glm_step`` section of benchmarks/results.json and re-renders benchmarks/results.md (``--quick``:
nothing written).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

from _common import training_blocks, update_results

os.environ.setdefault("OMP_NUM_THREADS", "1")

LR = 0.1
#: model -> (features d, classes k (1: binary logistic), examples n, batch b, sampling, loss, clip norm)
MODELS = {
    "logistic-30": (30, 1, 640, 32, "shuffle_once", "logistic", 1.0),
    "probe-512": (512, 10, 20000, 256, "poisson", "softmax", 2.01),  # softmax: clipping never active at C >= 2
}


#: model -> the goal on B/A (issue 29, item 7)
GOALS = {"logistic-30": 1.10, "probe-512": 1.05}


def _pipeline(accountant: str, data, spec, adam: bool = False):
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    from lastiter_plugins.adapters import opacus as lo

    d, k, _, b, sampling, loss_name, clip = spec
    torch.manual_seed(0)
    model = torch.nn.Sequential(lo.FeatureNormClip(1.0), torch.nn.Linear(d, k))
    loss = torch.nn.BCEWithLogitsLoss() if loss_name == "logistic" else torch.nn.CrossEntropyLoss()
    poisson = sampling == "poisson"
    sampler = None if poisson else lo.ShuffleOnceSampler(data, seed=0)
    loader = DataLoader(data, batch_size=b, sampler=sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = PrivacyEngine(accountant=accountant).make_private(
            module=model,
            optimizer=torch.optim.Adam(model.parameters(), lr=1e-3) if adam
            else torch.optim.SGD(model.parameters(), lr=LR, weight_decay=0.01),
            data_loader=loader, noise_multiplier=1.0, max_grad_norm=clip, poisson_sampling=poisson, criterion=loss,
        )  # fmt: skip
    return training_blocks(model, optimizer, loader, loss)


def _data(spec):
    import torch
    from torch.utils.data import TensorDataset

    d, k, n, *_ = spec
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen)
    x = x / x.norm(dim=1, keepdim=True)
    y = (torch.rand(n, 1, generator=gen) < 0.5).float() if k == 1 else torch.randint(0, k, (n,), generator=gen)
    return TensorDataset(x, y)


def ratios(first: str, second: str, spec, blocks: int, steps: int, adam: bool = False) -> tuple[list[float], float]:
    """B/A per block, and A's median CPU time per step (ms)."""
    import torch

    torch.set_num_threads(1)
    data = _data(spec)
    a, b = _pipeline(first, data, spec, adam), _pipeline(second, data, spec, adam)
    warm = -(-spec[2] // spec[3])
    a(warm), b(warm)  # one epoch first: hooks registered, caches warm
    out, times = [], []
    for block in range(blocks):
        if block % 2:
            tb, ta = b(steps), a(steps)
        else:
            ta, tb = a(steps), b(steps)
        out.append(tb / ta)
        times.append(ta / steps * 1e3)
    return out, statistics.median(times)


def _row(model: str, optimizer: str, blocks: int, steps: int) -> dict:
    """B/A and the A/A control for one model and optimizer (adam: the declared route, no model="glm")."""
    from lastiter_plugins.adapters import opacus as lo

    spec = MODELS[model]
    _, _, n, _, sampling, loss, _ = spec
    adam = optimizer == "adam"
    route = {} if adam else {"model": "glm", "loss": loss, "feature_norm": 1.0}
    relation = {"relation": "add_or_remove_one"} if sampling == "poisson" else {}
    name = lo.register(
        f"bench-glm-{model}-{optimizer}", sampling=sampling, dataset_size=n, learning_rate=LR, force=True,
        **route, **relation,
    )  # fmt: skip
    row: dict = {"model": model, "optimizer": optimizer, "goal": GOALS[model], "blocks": blocks,
                 "steps_per_block": steps}  # fmt: skip
    arm = "declared route with Adam / Opacus RDP with Adam" if adam else "GLM route / Opacus RDP"
    for key, label, pair in (("ratio", arm, ("rdp", name)), ("control", "A/A control", ("rdp", "rdp"))):
        values, step_ms = ratios(*pair, spec, blocks, steps, adam)
        row[key], row[f"{key}_spread"] = statistics.median(values), [min(values), max(values)]
        row.setdefault("step_ms", step_ms)
        print(f"{model} {optimizer} {label}: median {statistics.median(values):.3f} [{min(values):.3f}, "
              f"{max(values):.3f}] over {blocks} blocks of {steps} steps")  # fmt: skip
    row["load"] = os.getloadavg()[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], action="append", help="default: both")
    parser.add_argument("--quick", action="store_true", help="print only: nothing written")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    start, rows = time.perf_counter(), []
    for optimizer in args.optimizer or ["sgd", "adam"]:
        for model in MODELS if args.model == "all" else [args.model]:
            rows.append(_row(model, optimizer, args.blocks, args.steps))
    if not args.quick:
        command = f"python benchmarks/bench_glm_step.py --model {args.model} --blocks {args.blocks}"
        command += f" --steps {args.steps}" + "".join(f" --optimizer {o}" for o in args.optimizer or ())
        update_results("glm_step", rows, command=command, seconds=time.perf_counter() - start, threads=1)


if __name__ == "__main__":
    main()
