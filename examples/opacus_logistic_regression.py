r"""DP logistic regression on scikit-learn's breast-cancer data, certified from the model itself.

Runs on CPU, or on GPU when one is available, in a few seconds::

    python examples/opacus_logistic_regression.py [--epochs 30] [--noise 2.0] [--weight-decay 0.01]

No loss constant is declared by hand. ``register(..., model="glm", loss="logistic",
feature_norm=A)`` makes the accountant derive them, at ``make_private``, from the
model it is attached to (docs/opacus.md, "Certified linear models"):

- the model is ``FeatureNormClip(A)`` followed by one ``nn.Linear``: every feature
  vector the Linear sees has norm <= A for every possible example (the clip holds by
  construction, float rounding included), so the logistic loss of the score is
  (A^2 + 1)/4-smooth in the weights and bias, and its gradient is rank one;
- clipping may be active: clipping the gradient of a scalar GLM keeps it the gradient
  of a convex loss with the same smoothness (Song, Steinke, Thakkar & Thakurta 2021);
- ``SGD(weight_decay=w)`` adds w x after Opacus' noisy clipped mean (outside the
  clip): the accountant adds w to the smoothness and uses it as the strong
  convexity, which lets the epsilon stop growing with the number of epochs
  (Ye & Shokri 2022, arXiv 2203.05363);
- sampling: one secret random permutation reused every epoch (``ShuffleOnceSampler``),
  batch size dividing the number of training examples.

At every step the accountant checks that this is still the run: features from the
clip with norm <= A, the per-example gradients rank one and those of the logistic
loss, clip norm, weight decay and step size unchanged.

Features are standardised with the mean and standard deviation of the held-out
examples (treated as public: the private training examples are used for nothing but
the DP training). Per epoch it prints the test accuracy and the last-iterate epsilon
(final model only, replace-one neighbours) beside the number Opacus' RDP accountant
would give for the same noise, sample rate and steps (every iterate, add-or-remove
neighbours, and it assumes Poisson sampling, which this run does not use).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lastiter_plugins.adapters import opacus as lastiter_opacus
from lastiter_plugins.glm import certify_linear_model

DELTA = 1e-5
FEATURE_NORM = 1.0  # A: the FeatureNormClip bound


def load_data(train_size: int, seed: int):
    """Private training split and a held-out split treated as public (standardisation statistics, test)."""
    data = load_breast_cancer()
    order = np.random.default_rng(seed).permutation(len(data.data))
    train, public = order[:train_size], order[train_size:]
    mean, std = data.data[public].mean(axis=0), data.data[public].std(axis=0) + 1e-12
    x = ((data.data - mean) / std).astype(np.float32)
    y = data.target.astype(np.float32)
    return (torch.tensor(x[train]), torch.tensor(y[train])), (torch.tensor(x[public]), torch.tensor(y[public]))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    model.eval()
    with torch.no_grad():
        pred = (model(x.to(device)).squeeze(-1) > 0).float().cpu()
    model.train()
    return float((pred == y).float().mean())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--noise", type=float, default=2.0, help="noise multiplier z")
    parser.add_argument("--batch-size", type=int, default=48)
    parser.add_argument("--train-size", type=int, default=480, help="a multiple of the batch size")
    parser.add_argument("--clip", type=float, default=1.0, help="max_grad_norm C (clipping may be active)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="SGD weight_decay w (strong convexity)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*full backward hook")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    (x_train, y_train), (x_test, y_test) = load_data(args.train_size, args.seed)
    n, dim = x_train.shape
    # The step size needs M and lam before training: the same certificate the accountant derives.
    planned = certify_linear_model(
        "binary_logistic", feature_norm_bound=FEATURE_NORM, clip_norm=args.clip, bias=True, l2=args.weight_decay
    )
    learning_rate = 1.0 / (planned.smoothness + planned.strong_convexity)  # < 2/(lam + M) (Ye & Shokri)

    name = lastiter_opacus.register(
        "breast-cancer-glm",
        force=True,
        sampling="shuffle_once",
        dataset_size=n,
        learning_rate=learning_rate,
        model="glm",
        loss="logistic",
        feature_norm=FEATURE_NORM,
    )
    engine = PrivacyEngine()
    lastiter_opacus.attach(engine, name)  # on Opacus 1.6 also: PrivacyEngine(accountant=name)
    model = nn.Sequential(lastiter_opacus.FeatureNormClip(FEATURE_NORM), nn.Linear(dim, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, weight_decay=args.weight_decay)
    loader = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=args.batch_size,
        sampler=lastiter_opacus.ShuffleOnceSampler(n),  # secret seed: one permutation for every epoch
    )
    loss_fn = nn.BCEWithLogitsLoss()  # the accountant checks every step against this loss module
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        criterion=loss_fn,
        data_loader=loader,
        noise_multiplier=args.noise,
        max_grad_norm=args.clip,
        poisson_sampling=False,
    )
    derived = engine.accountant.registration.assumptions
    print(
        f"n={n}, b={args.batch_size}, z={args.noise}, C={args.clip:g}, lr={learning_rate:.4g}, device={device.type}\n"
        f"derived from the model: M={derived.smoothness:.4g}, lam={derived.strong_convexity:g}, "
        f"gradient norms within clip: {derived.gradient_norms_within_clip}, "
        f"clipped loss convex and smooth: {derived.clipped_loss_convex_smooth}"
    )
    start = time.time()
    for epoch in range(1, args.epochs + 1):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss_fn(model(xb).squeeze(-1), yb).backward()
            optimizer.step()
        # every epoch: the last-iterate epsilon levels off (with weight decay), the every-iterate one grows
        result = engine.accountant.epsilon_result(DELTA)
        rdp = RDPAccountant()
        rdp.history = list(engine.accountant.history)
        print(
            f"epoch {epoch:3d} | test accuracy {accuracy(model, x_test, y_test, device):.3f} | last-iterate "
            f"eps = {result.epsilon:.3f} (final model, {result.relation.value}, via {result.winner}) | Opacus RDP "
            f"eps = {rdp.get_epsilon(DELTA):.3f} (every iterate, add_or_remove_one, assumes Poisson) | "
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
