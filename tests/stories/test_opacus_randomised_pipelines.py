"""Randomised pipelines: the Opacus accountant either refuses, or reports exactly the
epsilon of the pipeline that ran, derived here from what the test itself did (the
examples the sampler actually visits, the batch size, the steps taken, what Opacus
divides by), never from the adapter."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from torch.utils.data import DataLoader, SequentialSampler, TensorDataset  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters import opacus as lo  # noqa: E402
from tests.adapters.opacus.support import engine as _engine  # noqa: E402

torch.set_num_threads(1)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook"),
    pytest.mark.filterwarnings("ignore:.*order"),
]

LR, DELTA, ORDERS = 0.5, 1e-5, [2.0, 4.0, 8.0, 16.0, 32.0]
SAMPLERS = ("sequential", "shuffle", "shuffle_once", "sequential_subset", "poisson")
SCHEME = {"sequential": "cyclic", "shuffle": "reshuffle", "shuffle_once": "shuffle_once",
          "sequential_subset": "cyclic", "poisson": "poisson"}  # fmt: skip
# variations applied at the start of the second epoch; "none" keeps the declared pipeline
VARIATIONS = ("none", "none", "none", "two_views", "second_optimizer", "shrink", "mutate_loader", "replace_loader",
              "lr_change", "half_batch")  # fmt: skip
PIPELINES = 30


def _menu(seed: int) -> dict:
    rng = random.Random(seed)
    sampler = rng.choice(SAMPLERS)
    variation = rng.choice(VARIATIONS)
    if sampler == "poisson" and variation == "replace_loader":  # not observable for Poisson: see docs/opacus.md
        variation = "none"
    return {"n": rng.choice([40, 48, 50]), "batch": rng.choice([8, 10, 16]), "sampler": sampler,
            "drop_last": sampler != "poisson" and rng.random() < 0.4, "reduction": rng.choice(["mean", "sum"]),
            "variation": variation}  # fmt: skip


def _data(n: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 3, generator=gen)
    return TensorDataset(x / x.norm(dim=1, keepdim=True), (torch.rand(n, generator=gen) < 0.5).float())


def _loader(data, m: dict) -> DataLoader:
    n, b, kind = len(data), m["batch"], m["sampler"]
    sampler = {"sequential": None, "shuffle": None, "poisson": None, "shuffle_once": lo.ShuffleOnceSampler(data),
               "sequential_subset": SequentialSampler(range(n // 2))}[kind]  # fmt: skip
    return DataLoader(data, batch_size=b, shuffle=kind == "shuffle", sampler=sampler, drop_last=m["drop_last"])


def _truth(m: dict, visited: int, loader_len: int, steps: int) -> lp.TrainingConfig | None:
    """The pipeline that ran, or None when no configuration describes it (then only a refusal is right)."""
    if m["variation"] != "none":
        return None
    n, b = visited, m["batch"]  # the examples the sampler visits per epoch are the dataset of the run
    if m["sampler"] == "poisson":
        b = math.ceil(m["n"] / loader_len)  # q = 1/len(loader): b/n >= q
    divisor = int(m["n"] * (1.0 / loader_len)) if m["reduction"] == "mean" else 1  # what Opacus divides by
    return lp.TrainingConfig(dataset_size=n, batch_size=b, noise_multiplier=1.0, steps=steps,
                             sampling=lp.Sampling(SCHEME[m["sampler"]]), learning_rate=LR * b / divisor,
                             relation=lp.Relation.ADD_OR_REMOVE_ONE if m["sampler"] == "poisson"
                             else lp.Relation.REPLACE_ONE)  # fmt: skip


def _run(m: dict, name: str) -> tuple[float | None, int, int, int]:
    """Train two epochs with the variation; (epsilon or None if refused, visited, len(loader), steps)."""
    data = _data(m["n"])
    loader = _loader(data, m)
    visited = len(loader.sampler) if m["drop_last"] is False else len(loader) * m["batch"]
    loader_len = len(loader)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    engine = _engine(name)
    try:
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), data_loader=loader,
            noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=m["sampler"] == "poisson",
            loss_reduction=m["reduction"],
        )  # fmt: skip
    except lp.NotApplicableError:
        return None, visited, loader_len, 0
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction=m["reduction"])
    steps, variation = 0, m["variation"]
    try:
        for epoch in range(2):
            batches = loader
            if epoch == 1:
                if variation == "shrink":
                    data.tensors = tuple(t[: m["n"] // 2] for t in data.tensors)
                elif variation == "mutate_loader":
                    if m["sampler"] == "poisson":
                        loader.batch_sampler.sample_rate /= 2
                    else:
                        loader.batch_sampler.batch_size *= 2
                elif variation == "replace_loader":
                    batches = DataLoader(data, batch_size=max(1, m["batch"] // 2))
                elif variation == "lr_change":
                    optimizer.param_groups[0]["lr"] = LR / 2
            for xb, yb in batches:
                optimizer.zero_grad()
                if epoch == 1 and variation == "half_batch":
                    xb, yb = xb[: len(xb) // 2], yb[: len(yb) // 2]
                loss_fn(model(xb).squeeze(-1), yb).backward()
                if epoch == 1 and variation == "two_views":
                    loss_fn(model(xb.flip(-1)).squeeze(-1), yb).backward()
                optimizer.step()
                steps += 1
                if epoch == 1 and variation == "second_optimizer":
                    with torch.no_grad():
                        model._module.bias.add_(0.01)  # a non-private update of some parameters
        return engine.get_epsilon(DELTA), visited, loader_len, steps
    except lp.PipelineChangedError:
        return None, visited, loader_len, steps


@pytest.mark.parametrize("seed", range(PIPELINES))
def test_refuses_or_reports_the_epsilon_of_the_run(seed):
    m = _menu(seed)
    name = lo.register(f"rand-{seed}", force=True, sampling=SCHEME[m["sampler"]], dataset_size=m["n"],
                       learning_rate=LR, smoothness=0.25, orders=ORDERS,
                       relation="add_or_remove_one" if m["sampler"] == "poisson" else "replace_one")  # fmt: skip
    reported, visited, loader_len, steps = _run(m, name)
    if reported is None:
        return  # refused: always allowed
    truth = _truth(m, visited, loader_len, steps)
    assert truth is not None, f"{m}: the run is not one any configuration describes, yet {reported} was reported"
    assumptions = lp.LossAssumptions(smoothness=0.25)
    expected = lp.epsilon("best", DELTA, ORDERS, config=truth, assumptions=assumptions).epsilon
    assert reported == pytest.approx(expected, rel=1e-12), m


def test_menu_covers_refusals_and_numbers():
    """The seeds exercise both outcomes and every variation (a menu that never refuses could not fail)."""
    menus = [_menu(seed) for seed in range(PIPELINES)]
    assert {m["variation"] for m in menus} == set(VARIATIONS)
    assert {m["sampler"] for m in menus} == set(SAMPLERS)
    assert sum(m["variation"] == "none" and m["sampler"] != "sequential_subset" for m in menus) >= 5
