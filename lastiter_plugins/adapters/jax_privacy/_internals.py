r"""Everything the jax_privacy adapter reads from jax_privacy's and Keras' private state, or patches, in one place.

Tested against jax_privacy 2.0.0 and Keras 3.15 (JAX backend, jax 0.10); :func:`require_tested_hosts` refuses
other versions (``lastiter_plugins.UnsupportedHostError``). What is read or patched, and why:

* ``model._dp_params`` (the ``DPKerasConfig`` ``keras_api.make_private`` set) and ``model._dp_noise_multiplier``
  (the noise multiplier it calibrated and cached): the Keras API offers no getter for the config;
* the non-trainable weight ``_optimizer_steps`` ``make_private`` adds (the host's count of noisy physical steps)
  and the optimizer's ``_iterations`` (physical steps; its public ``iterations`` divides by the accumulation);
* :class:`Recorder`, installed for the duration of one ``fit`` call and removed after it, patches

  - ``ArrayDataAdapter._get_iterator`` (Keras): each pass over in-memory arrays, the indices of every batch it
    yields (Keras shuffles arrays there, with ``np.random.permutation``);
  - ``keras_api._PoissonSampledTrainingDataset.__getitem__`` and ``on_epoch_end`` (jax_privacy): the indices of
    every Poisson batch ``fit`` is fed with ``poisson_sampling_in_fit=True`` (padding rows, index -1, dropped);
  - ``jax_privacy.clipped_grad`` and ``jax_privacy.noise_addition.gaussian_privatizer``, which
    ``keras_api._noised_clipped_grads`` calls when the train step is traced: the clip norm, the divisor, the
    rescaling and the noise std the compiled step was built with (read, then passed on unchanged);
  - Keras' ``Trainer._symbolic_build`` and ``keras_api._maybe_symbolically_build_private_model``, which read one
    batch for its shapes only (symbolic tensors, no values) before training: the batches drawn inside them feed no
    step and are not recorded.

Nothing else of the hosts is touched; the rest of the adapter uses their public API.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import lastiter_plugins as lp

#: (package, tested release prefix): the versions these reads were written and tested against.
TESTED = {"jax-privacy": ("2.0.",), "keras": ("3.15.",)}


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def require_tested_hosts(*packages: str) -> None:
    """Refuse (UnsupportedHostError) a version of ``packages`` these reads were not tested with."""
    for package in packages:
        found = _version(package)
        if not found.startswith(TESTED[package]):
            raise lp.UnsupportedHostError(
                f"{package} must be {' or '.join(p + 'x' for p in TESTED[package])} for "
                f"lastiter_plugins.adapters.jax_privacy (the versions its reads of {package}'s internals were "
                f"tested with). Found {found}."
            )


# -- reads of private state


def dp_config(model: Any) -> Any:
    """The ``DPKerasConfig`` ``keras_api.make_private`` attached to ``model`` (ValueError when it was not made
    private)."""
    params = getattr(model, "_dp_params", None)
    if params is None:
        raise ValueError(
            "model must be made private with jax_privacy.keras_api.make_private(model, config) before it is watched. "
            f"Found a {type(model).__name__} without a DPKerasConfig."
        )
    return params


def cached_noise_multiplier(model: Any) -> float | None:
    """The noise multiplier the config gave or the host calibrated and cached (None: not calibrated yet)."""
    value = getattr(model, "_dp_noise_multiplier", None)
    return None if value is None else float(value)


def host_steps(model: Any) -> int:
    """Noisy physical steps the host counted (``_optimizer_steps``)."""
    weight = next(w for w in model.non_trainable_weights if w.name == "_optimizer_steps")
    return int(np.asarray(weight.numpy()).item())


def optimizer_physical_steps(optimizer: Any) -> int:
    """Physical steps the Keras optimizer applied (``_iterations``, before the division by the accumulation)."""
    return int(np.asarray(optimizer._iterations.numpy()).item())


# -- what one fit call feeds the step and traces


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch fed to the step: ``pass_id`` numbers the passes (a Keras iterator over arrays, or an epoch of the
    Poisson dataset) across the accountant's fit calls; ``position`` its place in the pass; the real indices."""

    pass_id: int
    position: int
    indices: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Traced:
    """What the compiled step was built with (recorded when jax traced it)."""

    clip_norm: float
    rescale_to_unit_norm: bool
    normalize_by: float
    l2_norm_bound: float
    stddev: float | None = None


class Recorder:
    """The patches of one fit call (see the module docstring): installed by :meth:`install`, removed by
    :meth:`remove`. Records the batches fed to the step (:attr:`batches`, until :meth:`take`) and what the
    traced step used (:attr:`traced`). Only calls made on the installing thread are recorded."""

    def __init__(self, first_pass_id: int) -> None:
        self.batches: list[Batch] = []
        self.traced: list[Traced] = []
        self.array_passes = 0
        self.poisson_passes = 0
        self._next_pass = first_pass_id
        self._undo: list[Callable[[], None]] = []
        self._thread = threading.get_ident()

    @property
    def next_pass_id(self) -> int:
        return self._next_pass

    def take(self) -> list[Batch]:
        """The batches recorded since the last call."""
        out, self.batches = self.batches, []
        return out

    def _mine(self) -> bool:
        return threading.get_ident() == self._thread

    def _new_pass(self) -> int:
        pass_id, self._next_pass = self._next_pass, self._next_pass + 1
        return pass_id

    def install(self) -> None:
        import jax_privacy
        import jax_privacy.noise_addition as noise_addition
        from jax_privacy import keras_api
        from keras.src.trainers.data_adapters import array_data_adapter

        self._patch(array_data_adapter.ArrayDataAdapter, "_get_iterator", self._array_iterator)
        dataset = keras_api._PoissonSampledTrainingDataset
        self._patch(dataset, "__getitem__", self._poisson_item)
        self._patch(dataset, "on_epoch_end", self._poisson_epoch_end)
        self._patch(jax_privacy, "clipped_grad", self._clipped_grad)
        self._patch(noise_addition, "gaussian_privatizer", self._privatizer)
        from keras.src.trainers import trainer

        self._patch(trainer.Trainer, "_symbolic_build", self._shapes_only)
        self._patch(keras_api, "_maybe_symbolically_build_private_model", self._shapes_only)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    # -- builds that read one batch for its shapes only (Keras' ``_symbolic_build``, jax_privacy's before a
    # Poisson fit): the batches they draw feed no step
    def _shapes_only(self, original: Any) -> Any:
        recorder = self

        @functools.wraps(original)
        def build(*args: Any, **kwargs: Any) -> Any:
            before = len(recorder.batches)
            try:
                return original(*args, **kwargs)
            finally:
                if recorder._mine():
                    del recorder.batches[before:]

        return build

    # -- Keras arrays
    def _array_iterator(self, original: Any) -> Any:
        recorder = self

        @functools.wraps(original)
        def _get_iterator(adapter: Any, slice_and_convert_fn: Any, inputs: Any) -> Iterator[Any]:
            if not recorder._mine():
                yield from original(adapter, slice_and_convert_fn, inputs)
                return
            pass_id = recorder._new_pass()
            recorder.array_passes += 1
            seen: list[Any] = []

            def recording(sliceable: Any, indices: Any = None) -> Any:
                seen.append(indices)
                return slice_and_convert_fn(sliceable, indices=indices)

            for position, batch in enumerate(original(adapter, recording, inputs)):
                recorder.batches.append(Batch(pass_id, position, _as_indices(seen[0], adapter._num_samples)))
                seen.clear()
                yield batch

        return _get_iterator

    # -- jax_privacy's Poisson dataset
    def _poisson_item(self, original: Any) -> Any:
        recorder = self

        @functools.wraps(original)
        def __getitem__(dataset: Any, index: int) -> Any:
            if recorder._mine():
                if not hasattr(dataset, "_lastiter_pass"):
                    dataset._lastiter_pass = recorder._new_pass()
                    recorder.poisson_passes += 1
                padded = np.asarray(dataset._epoch_batches[index])
                real = tuple(sorted(int(i) for i in padded[padded >= 0]))
                recorder.batches.append(Batch(dataset._lastiter_pass, int(index), real))
            return original(dataset, index)

        return __getitem__

    def _poisson_epoch_end(self, original: Any) -> Any:
        recorder = self

        @functools.wraps(original)
        def on_epoch_end(dataset: Any) -> None:
            original(dataset)
            if recorder._mine() and hasattr(dataset, "_lastiter_pass"):
                del dataset._lastiter_pass  # the next epoch's batches are a new pass

        return on_epoch_end

    # -- the traced step
    def _clipped_grad(self, original: Any) -> Any:
        recorder = self

        @functools.wraps(original)
        def clipped_grad(*args: Any, **kwargs: Any) -> Any:
            made = original(*args, **kwargs)
            if recorder._mine():
                recorder.traced.append(
                    Traced(
                        clip_norm=float(kwargs.get("l2_clip_norm", 1.0)),
                        rescale_to_unit_norm=bool(kwargs.get("rescale_to_unit_norm", False)),
                        normalize_by=float(kwargs.get("normalize_by", 1.0)),
                        l2_norm_bound=float(made.l2_norm_bound),
                    )
                )
            return made

        return clipped_grad

    def _privatizer(self, original: Any) -> Any:
        recorder = self

        @functools.wraps(original)
        def gaussian_privatizer(*args: Any, **kwargs: Any) -> Any:
            if recorder._mine() and recorder.traced and recorder.traced[-1].stddev is None:
                recorder.traced[-1] = dataclasses.replace(recorder.traced[-1], stddev=float(kwargs["stddev"]))
            return original(*args, **kwargs)

        return gaussian_privatizer


def _as_indices(indices: Any, num_samples: int) -> tuple[int, ...]:
    """A batch's indices (Keras passes a slice when it does not shuffle), sorted: a batch's set of examples, not
    their order inside it, fixes its clipped sum."""
    if isinstance(indices, slice):
        return tuple(range(*indices.indices(num_samples)))
    return tuple(sorted(int(i) for i in np.asarray(indices).ravel()))
