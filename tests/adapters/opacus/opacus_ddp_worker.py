"""Two-process (gloo, CPU, localhost) DP training with Opacus' DistributedDPOptimizer
and a last-iterate accountant; used by test_adapter.py beside it.

Run as ``python tests/adapters/opacus/opacus_ddp_worker.py OUT.json``: writes one record per rank
(steps in the accountant's history, steps taken, epsilon, optimizer class).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from opacus import PrivacyEngine, accountants
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from torch.utils.data import DataLoader, TensorDataset

from lastiter_plugins.adapters import opacus as lo

N, GLOBAL_BATCH, EPOCHS, LR, DELTA = 100, 20, 2, 0.5, 1e-5
ORDERS = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
NAME = "ddp-last-iterate"


def _setup() -> str:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    return lo.register(NAME, force=True, sampling="poisson", relation="add_or_remove_one", dataset_size=N,
                       learning_rate=LR, smoothness=0.25, orders=ORDERS)  # fmt: skip


def _engine(name: str) -> PrivacyEngine:
    """PrivacyEngine(accountant=name); Opacus 1.5 has no accountant registry: attach it instead."""
    if hasattr(accountants, "register_accountant"):
        return PrivacyEngine(accountant=name)
    engine = PrivacyEngine()
    lo.attach(engine, name)
    return engine


def _data() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=gen)
    x = x / x.norm(dim=1, keepdim=True)
    return TensorDataset(x, (torch.rand(N, generator=gen) < 0.5).float())


def _train(engine, model, steps_wanted=None):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    model = model(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    # the full-data loader with the GLOBAL batch size; Opacus derives q = 1/len(loader)
    model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer,
                                                   data_loader=DataLoader(_data(), batch_size=GLOBAL_BATCH),
                                                   noise_multiplier=1.0, max_grad_norm=1.0)  # fmt: skip
    taken = 0
    for _ in range(EPOCHS):
        for xb, yb in loader:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb).squeeze(-1), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            taken += 1
            if steps_wanted is not None and taken == steps_wanted:
                return optimizer, taken
    return optimizer, taken


def single_process_epsilon(steps: int) -> float:
    """Epsilon of the same run in one process (same global batch, same number of steps)."""
    name = _setup()
    engine = _engine(name)
    while True:  # Poisson epochs may yield fewer batches: train until `steps` steps
        _train(engine, lambda m: m, steps_wanted=steps - engine.accountant.steps)
        if engine.accountant.steps >= steps:
            break
    assert engine.accountant.steps == steps
    return engine.get_epsilon(DELTA)


def _worker(rank: int, world: int, port: int, outdir: str) -> None:
    name = _setup()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(100 + rank)  # each rank's Poisson draws
        engine = _engine(name)
        optimizer, taken = _train(engine, DPDDP)
        record = {
            "rank": rank,
            "steps": engine.accountant.steps,
            "expected_steps": taken,
            "epsilon": engine.get_epsilon(DELTA),
            "optimizer": type(optimizer).__name__,
        }
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as fh:
            json.dump(record, fh)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(out: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_worker, args=(2, port, outdir), nprocs=2, join=True)
        records = []
        for r in range(2):
            with open(os.path.join(outdir, f"rank{r}.json")) as fh:
                records.append(json.load(fh))
    with open(out, "w") as fh:
        json.dump(records, fh)


if __name__ == "__main__":
    main(sys.argv[1])
