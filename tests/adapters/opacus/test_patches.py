"""lastiter_plugins/adapters/opacus/_patches.py: every patch of torch and Opacus in one object, installed while a
run holds it and removed when the last run ends, for the host versions it was written for."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from torch.utils.data import BatchSampler, DataLoader  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters.opacus import _patches  # noqa: E402

from .support import dataset  # noqa: E402
from .support import engine as _engine  # noqa: E402


class _Run:
    """A run's stand-in: holds the patches while alive."""


def _installed() -> list[bool]:
    return [patch.installed for patch in _patches.PATCHES.patches]


def test_the_patches_are_installed_while_a_run_holds_them_and_removed_after():
    gc.collect()
    before = _patches.PATCHES._holders
    originals = {(p.owner, p.name): p.owner.__dict__[p.name] for p in _patches.PATCHES.patches}
    first, second = _Run(), _Run()
    _patches.PATCHES.hold(first)
    _patches.PATCHES.hold(second)
    assert all(_installed())
    assert getattr(BatchSampler.__iter__, "_lastiter_patch", False)
    del first
    gc.collect()
    assert all(_installed())  # (the second run still holds them)
    del second
    gc.collect()
    if before == 0:  # (no run of another test alive in this process)
        assert not any(_installed())
        for patch in _patches.PATCHES.patches:
            assert patch.owner.__dict__[patch.name] is originals[(patch.owner, patch.name)] or not patch.installed
        assert not getattr(BatchSampler.__iter__, "_lastiter_patch", False)


def test_a_patch_wrapped_again_by_someone_else_stays_in_their_chain():
    held = _Run()
    _patches.PATCHES.hold(held)
    ours = BatchSampler.__iter__
    theirs = lambda self: ours(self)  # noqa: E731  (another library's patch over ours)
    BatchSampler.__iter__ = theirs
    try:
        del held
        gc.collect()
        assert BatchSampler.__iter__ is theirs  # not torn out of their chain
        sampler = BatchSampler(range(5), batch_size=2, drop_last=False)
        assert list(sampler) == [[0, 1], [2, 3], [4]]  # ours passes every call through
    finally:
        BatchSampler.__iter__ = ours.__wrapped__ if not _patches.PATCHES.installed else ours


def test_an_unrecorded_sampler_iterates_as_torchs_own():
    held = _Run()
    _patches.PATCHES.hold(held)
    sampler = BatchSampler(range(7), batch_size=3, drop_last=False)
    assert type(sampler) is BatchSampler and list(sampler) == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("version", ["2.14.0", "3.0.0", "1.13.1"])
def test_an_untested_torch_is_refused(version):
    with pytest.raises(lp.UnsupportedHostError, match=f"torch version must be between .* Found torch {version}"):
        _patches.require_tested_torch(version)


@pytest.mark.parametrize("version", ["2.0.1", "2.6.0+cu124", "2.13.0+cpu"])
def test_a_tested_torch_is_accepted(version):
    _patches.require_tested_torch(version)


def test_a_run_binds_the_patches_for_its_lifetime(request):
    from lastiter_plugins.adapters import opacus as lo

    name = lo.register("patches-" + request.node.name, force=True, sampling="cyclic", dataset_size=20)
    engine = _engine(name)
    model = torch.nn.Linear(3, 1)
    engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(dataset(20), batch_size=5), noise_multiplier=1.0, max_grad_norm=1.0,
        poisson_sampling=False,
    )  # fmt: skip
    assert _patches.PATCHES.installed
    holders = _patches.PATCHES._holders
    engine.accountant.run.remove()
    engine.accountant.run = None  # the run ends with its accountant's reference
    gc.collect()
    assert _patches.PATCHES._holders == holders - 1
