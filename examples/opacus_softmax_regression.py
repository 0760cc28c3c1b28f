r"""DP softmax regression (10 classes) on scikit-learn's digits, certified from the model itself.

Runs on CPU, or on GPU when one is available, in a few seconds::

    python examples/opacus_softmax_regression.py [--epochs 20] [--noise 2.0] [--weight-decay 0.005]

``register(..., model="glm", loss="softmax", feature_norm=A)`` derives the loss
assumptions from the model (docs/opacus.md, "Certified linear models"): features
clipped to norm A by ``FeatureNormClip``, one ``nn.Linear`` with 10 outputs and
``CrossEntropyLoss``. The softmax cross-entropy is (A^2 + 1)/2-smooth in the weights
and bias (the covariance of a softmax has eigenvalues <= 1/2) and its per-example
gradient has norm <= sqrt(2) sqrt(A^2 + 1). Unlike a binary GLM, clipping the gradient
of a vector-output loss can break the convexity the bounds need, so the clip norm is
chosen where clipping is provably never active: ``certify_linear_model(...).
clip_norm_never_active`` (the gradient bound plus a margin for Opacus' 1e-6 and float32
rounding). The accountant refuses a smaller ``max_grad_norm``. ``SGD(weight_decay=w)``
is folded into the constants (outside the clip under Opacus).

The digits are split once into 1440 private training examples and 357 held-out
ones, treated as public: they give the standardisation statistics and the test
accuracy. Sampling: one secret permutation reused every epoch (``ShuffleOnceSampler``).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lastiter_plugins.adapters import opacus as lastiter_opacus
from lastiter_plugins.glm import certify_linear_model

DELTA = 1e-5
FEATURE_NORM = 1.0  # A: the FeatureNormClip bound
CLASSES = 10


def load_data(train_size: int, seed: int):
    """Private training split and a held-out split treated as public (standardisation statistics, test)."""
    data = load_digits()
    order = np.random.default_rng(seed).permutation(len(data.data))
    train, public = order[:train_size], order[train_size:]
    mean, std = data.data[public].mean(axis=0), data.data[public].std(axis=0) + 1.0  # +1: constant pixels
    x = ((data.data - mean) / std).astype(np.float32)
    y = data.target.astype(np.int64)
    return (torch.tensor(x[train]), torch.tensor(y[train])), (torch.tensor(x[public]), torch.tensor(y[public]))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(x.to(device)).argmax(dim=1).cpu()
    model.train()
    return float((pred == y).float().mean())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--noise", type=float, default=2.0, help="noise multiplier z")
    parser.add_argument("--batch-size", type=int, default=96)
    parser.add_argument("--train-size", type=int, default=1440, help="a multiple of the batch size")
    parser.add_argument("--weight-decay", type=float, default=0.005, help="SGD weight_decay w (strong convexity)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*full backward hook")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    (x_train, y_train), (x_test, y_test) = load_data(args.train_size, args.seed)
    n, dim = x_train.shape
    # Clipping must be never active for softmax: the smallest such clip norm, rounded up.
    bound = certify_linear_model(
        "softmax_cross_entropy", feature_norm_bound=FEATURE_NORM, clip_norm=1.0, bias=True, num_classes=CLASSES
    )
    clip = math.ceil(bound.clip_norm_never_active * 1000) / 1000
    planned = certify_linear_model(
        "softmax_cross_entropy",
        feature_norm_bound=FEATURE_NORM,
        clip_norm=clip,
        bias=True,
        num_classes=CLASSES,
        l2=args.weight_decay,
    )
    learning_rate = 1.0 / (planned.smoothness + planned.strong_convexity)  # < 2/(lam + M) (Ye & Shokri)

    name = lastiter_opacus.register(
        "digits-softmax-glm",
        force=True,
        sampling="shuffle_once",
        dataset_size=n,
        learning_rate=learning_rate,
        model="glm",
        loss="softmax",
        feature_norm=FEATURE_NORM,
    )
    engine = PrivacyEngine()
    lastiter_opacus.attach(engine, name)  # on Opacus 1.6 also: PrivacyEngine(accountant=name)
    model = nn.Sequential(lastiter_opacus.FeatureNormClip(FEATURE_NORM), nn.Linear(dim, CLASSES)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, weight_decay=args.weight_decay)
    loader = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=args.batch_size,
        sampler=lastiter_opacus.ShuffleOnceSampler(n),  # secret seed: one permutation for every epoch
    )
    loss_fn = nn.CrossEntropyLoss()  # the accountant checks every step against this loss module
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        criterion=loss_fn,
        data_loader=loader,
        noise_multiplier=args.noise,
        max_grad_norm=clip,
        poisson_sampling=False,
    )
    derived = engine.accountant.registration.assumptions
    print(
        f"n={n}, b={args.batch_size}, z={args.noise}, C={clip:g} (never active), lr={learning_rate:.4g}, "
        f"device={device.type}\nderived from the model: M={derived.smoothness:.4g}, "
        f"lam={derived.strong_convexity:g}, gradient norms within clip: {derived.gradient_norms_within_clip}"
    )
    start = time.time()
    for epoch in range(1, args.epochs + 1):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()
        # every epoch: with weight decay the last-iterate epsilon levels off
        result = engine.accountant.epsilon_result(DELTA)
        print(
            f"epoch {epoch:3d} | test accuracy {accuracy(model, x_test, y_test, device):.3f} | last-iterate "
            f"eps = {result.epsilon:.3f} (final model, {result.relation.value}, via {result.winner}) | "
            f"delta = {DELTA:g}"
        )
    final = engine.accountant.epsilon_result(DELTA)
    test_accuracy = accuracy(model, x_test, y_test, device)
    print(f"trained in {time.time() - start:.1f} s")
    print(f"certified: {final}")
    print(f"test accuracy: {test_accuracy:.3f}")
    print()
    engine.accountant.report(DELTA, show=True, explain=True)  # the answer, then every bound and the threat model
    return {"epsilon": float(final.epsilon), "accuracy": test_accuracy}


if __name__ == "__main__":
    main()
