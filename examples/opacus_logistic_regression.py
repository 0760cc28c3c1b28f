r"""DP logistic regression on scikit-learn's breast-cancer data with a last-iterate accountant.

Runs on CPU, or on GPU when one is available, in a few seconds::

    python examples/opacus_logistic_regression.py [--epochs 40] [--noise 2.0]

Every assumption declared to the accountant is made true by construction
(docs/opacus.md explains why, and where it stops holding):

- Features: standardised with the mean and standard deviation of the held-out
  examples (treated as public: the private training examples are used for nothing
  but the DP training), each row scaled to norm 1, a constant 1 appended, the whole
  row divided by sqrt(2): every example has ||z|| = 1 exactly, whatever its values.
- Loss of example i: f_i(w) = log(1 + exp(-y_i <w, z_i>)) + (lam / 2) ||w||^2, the
  l2 regulariser folded into every per-example loss. Its
  Hessian lies between lam I and (||z||^2 / 4 + lam) I, so f_i is lam-strongly
  convex and M-smooth with M = max ||z||^2 / 4 + lam, where the max is over every
  possible example (||z|| = 1 by construction), not only over this data set.
- Domain: after every step the weights are projected onto the l2 ball of radius R
  (diameter D = 2R), so ||w|| <= R and every per-example gradient has norm
  < ||z|| + lam R. With max_grad_norm = C = 1 + lam R (+ a small margin), clipping
  never changes a gradient anywhere in the domain: ``gradient_norms_within_clip=True`` is honest.
- Sampling: one secret random permutation reused every epoch (ShuffleOnceSampler),
  batch size dividing the number of training examples.

Per epoch it prints the last-iterate epsilon (final model only, replace-one
neighbours) beside the number Opacus' RDP accountant would give for the same
noise, sample rate and steps (every iterate, add-or-remove neighbours, and it
assumes Poisson sampling, which this run does not use).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.grad_sample import register_grad_sampler
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lastiter_plugins.adapters import opacus as lastiter_opacus

DELTA = 1e-5
FEATURE_NORM = 1.0  # ||z|| for every possible example, by construction


class RegularisedLogit(nn.Module):
    """z -> <w, z>, whose per-example gradient includes the l2 term lam * w.

    Opacus builds the private gradient from per-example gradients only, so the
    regulariser must be part of them (a term added to the batch loss would never
    reach Opacus' per-sample gradients).
    """

    def __init__(self, dim: int, lam: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, dim))
        self.lam = lam

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.weight.t()


@register_grad_sampler(RegularisedLogit)
def _regularised_logit_grad_sample(layer: RegularisedLogit, activations, backprops):
    z = activations[0].to(backprops.dtype)
    per_example = torch.einsum("ni,nj->nij", backprops, z)  # gradient of the logistic term
    return {layer.weight: per_example + layer.lam * layer.weight.detach().unsqueeze(0)}


def load_data(train_size: int, seed: int):
    """Private training split and a held-out split treated as public.

    The standardisation statistics come from the held-out split only (the private
    examples are never used to fit anything but the model); every private row is
    then scaled to norm 1 and given a constant bias feature, so ||z|| = 1.
    """
    data = load_breast_cancer()
    order = np.random.default_rng(seed).permutation(len(data.data))
    train, public = order[:train_size], order[train_size:]
    mean, std = data.data[public].mean(axis=0), data.data[public].std(axis=0) + 1e-12
    x = (data.data - mean) / std
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    z = np.hstack([x, np.ones((len(x), 1))]) / math.sqrt(2.0)  # constant feature for the bias; ||z|| = 1
    y = data.target.astype(np.float32)
    as_tensor = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return (as_tensor(z[train]), as_tensor(y[train])), (as_tensor(z[public]), as_tensor(y[public]))


def accuracy(model: nn.Module, z: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    with torch.no_grad():
        pred = (model(z.to(device)).squeeze(-1) > 0).float().cpu()
    return float((pred == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--noise", type=float, default=2.0, help="noise multiplier z")
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--train-size", type=int, default=480, help="a multiple of the batch size")
    parser.add_argument("--lam", type=float, default=0.05, help="l2 regularisation strength (strong convexity)")
    parser.add_argument("--radius", type=float, default=10.0, help="radius R of the parameter ball")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*full backward hook")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    (z_train, y_train), (z_test, y_test) = load_data(args.train_size, args.seed)
    n, dim = z_train.shape
    assert float(z_train.norm(dim=1).max()) <= FEATURE_NORM + 1e-6

    # constants of the declared assumptions, derived from the construction above
    lam = args.lam
    smoothness = FEATURE_NORM**2 / 4.0 + lam  # M: Hessian <= (||z||^2/4 + lam) I
    diameter = 2.0 * args.radius  # D
    # C >= every per-example gradient norm on the ball: |sigmoid| * ||z|| + lam * ||w|| <= 1 + lam * R. The margin
    # covers Opacus' clip factor C / (norm + 1e-6) and float32 rounding, so clipping never changes a gradient.
    clip_norm = FEATURE_NORM + lam * args.radius + 1e-3
    learning_rate = 1.0 / (smoothness + lam)  # < 2/(lam + M) (Ye & Shokri) and <= 1/M (Kong & Ribero, no clipping)

    name = lastiter_opacus.register(
        "breast-cancer-last-iterate",
        force=True,
        sampling="shuffle_once",
        dataset_size=n,
        learning_rate=learning_rate,
        smoothness=smoothness,
        strong_convexity=lam,
        diameter=diameter,
        gradient_norms_within_clip=True,
    )
    engine = PrivacyEngine(accountant=name)
    model = RegularisedLogit(dim, lam).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loader = DataLoader(
        TensorDataset(z_train, y_train),
        batch_size=args.batch_size,
        sampler=lastiter_opacus.ShuffleOnceSampler(n),  # secret seed: one permutation for every epoch
    )
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=args.noise,
        max_grad_norm=clip_norm,
        poisson_sampling=False,
    )
    lastiter_opacus.attach_projection(optimizer, diameter)

    print(
        f"n={n}, b={args.batch_size}, z={args.noise}, lr={learning_rate:.4g}, M={smoothness:.4g}, lam={lam:g}, "
        f"D={diameter:g}, C={clip_norm:.4g}, device={device.type}"
    )
    loss_fn = nn.BCEWithLogitsLoss()
    start = time.time()
    for epoch in range(1, args.epochs + 1):
        for zb, yb in loader:
            zb, yb = zb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss_fn(model(zb).squeeze(-1), yb).backward()
            optimizer.step()
        result = engine.accountant.epsilon_result(DELTA)
        rdp = RDPAccountant()
        rdp.history = list(engine.accountant.history)
        print(
            f"Epoch {epoch:3d} | test acc {accuracy(model, z_test, y_test, device):.3f} | "
            f"last-iterate eps = {result.epsilon:.3f} (final model, {result.relation.value}, via {result.winner}) | "
            f"Opacus RDP eps = {rdp.get_epsilon(DELTA):.3f} (every iterate, add_or_remove_one, assumes Poisson) "
            f"| delta = {DELTA:g}"
        )
    print(f"trained in {time.time() - start:.1f} s")
    print()
    engine.accountant.report(DELTA, show=True)


if __name__ == "__main__":
    main()
