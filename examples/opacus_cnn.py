r"""What a deep network gets: a small CNN trained with Adam on a shuffling loader, accounted as it ran.

Runs on CPU in a few seconds::

    python examples/opacus_cnn.py [--epochs 3] [--noise 1.0] [--poisson]

The pipeline most DP-SGD users run: a CNN, ``torch.optim.Adam``, ``DataLoader(shuffle=True)`` and
``make_private(poisson_sampling=False)``, on scikit-learn's 8x8 digits. Nothing is declared about the
losses and no learning rate is given. The accountant observes what every step did (here: Adam, so no
last-iterate row can apply) and gives the number the core gives for that pipeline: the every-iterate row
of the sampler observed (a reshuffling loader: one Gaussian mechanism per epoch, composed exactly). Beside
it, what Opacus' own default accountant (``prv``) would print for the run: it assumes Poisson sampling,
which this loader does not do, so its number is marked NOT VALID. Then the routes to a smaller valid number:
``--poisson`` samples the batches as that accountant assumes (its number is then valid, and so is ours, a
little below it); a linear head on frozen public features (``register(model="glm")``, docs/opacus.md)
lets the last-iterate rows apply.

The model and the loader's generator are seeded so that the output is reproducible (tests/stories compare
it with README.md); for a model you release, leave the seeds to the operating system and use
``PrivacyEngine(secure_mode=True)`` (docs/opacus.md, *Preconditions*).
"""

from __future__ import annotations

import argparse
import warnings

import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lastiter_plugins.adapters import opacus as lastiter_opacus

DELTA = 1e-5


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """The digits (1797 images of 8x8 pixels, 10 classes): 1500 private training images, the rest held out."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    train, test = order[:1500], order[1500:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 2 * 2, 10),
    )  # fmt: skip


def main(epochs: int = 3, noise: float = 1.0, poisson: bool = False, batch_size: int = 100) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # (one thread: the same floating-point sums, so the same accuracy, on every machine)
    train, test = load_data()
    sampling = "poisson" if poisson else "reshuffle"
    extra = {"relation": "add_or_remove_one"} if poisson else {}
    lastiter_opacus.register("cnn", sampling=sampling, dataset_size=len(train), force=True, **extra)
    engine = PrivacyEngine()
    lastiter_opacus.attach(engine, "cnn")  # (on Opacus 1.6 also: PrivacyEngine(accountant="cnn"))
    model = cnn()
    generator = torch.Generator().manual_seed(1)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.02),
        data_loader=DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator),
        noise_multiplier=noise,
        max_grad_norm=1.0,
        poisson_sampling=poisson,
    )
    criterion = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            criterion(model(xb), yb).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean())
    report = engine.accountant.report(DELTA)
    result = engine.accountant.epsilon_result(DELTA)
    print(f"{len(train)} digits, CNN, Adam, {sampling}, b = {batch_size}, {report.steps} steps, z = {noise}, C = 1")
    print(report)  # the first screen: the answer; report.explain(): every row, why, the advice, the threat model
    print(f"test accuracy {accuracy:.2f} ({len(test)} held-out digits)")
    return {"epsilon": result.epsilon, "winner": result.winner, "report": report, "accuracy": accuracy}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--poisson", action="store_true", help="Poisson sampling (make_private's default)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
    main(args.epochs, args.noise, args.poisson)
