"""The usual step's checks, compiled into one function.

At every optimizer step the accountant must re-establish what its number depends on
(:mod:`._observe`, :class:`._steps.StepChecks`, :class:`._loaders.LoaderWatch`).
Run as written, those checks cost about 16 microseconds a step, mostly cache misses
(the training step between two hooks evicts what they touch, the bytecode included):
2.5% of a small model's step, against a goal of 1%. :func:`compile_fast_step` takes
the objects a full check has just accepted and returns one function that, at the next
steps, compares the objects the optimizer and the loader hold now with those, by
identity, and the step's data (per-example gradients, examples seen, batch position,
parameter versions) with the plan.

Contract: the function returns True only when the full check would have passed and
recorded the same step (it then records it); in every other case, a change or
anything it does not cover (a skipped step, a sampler it does not inline), it returns
False having changed nothing, and the accountant runs the full check, which raises the
precise error or accepts and compiles again. A comparison by identity can only err
towards False: an object of an immutable type that is still the very object accepted
still has the accepted value. The classes involved (torch's, Opacus', this package's)
are taken as fixed during a run, as the full check also takes them. It never raises.
One check is left to the step post-hook (:func:`compile_version_record`), which runs
while torch iterates the post-hooks: that it runs first. A post-hook moved in front of
it (only possible through torch's private hook dict) is seen there, after the step,
and the step's record then makes the next step and every epsilon refuse.

Written for a cold cache: the source is generated for the run's shape (one param group
of a few tensors unrolled, the loader's kind inlined), so that a step executes no
bytecode it does not need; every constant is a default argument (a fast local); one
frame, no helper calls on the way. The generated code is cached by shape.
"""

from __future__ import annotations

import functools
import re
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from opacus.optimizers import DistributedDPOptimizer

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts, LoaderWatch
from lastiter_plugins.adapters.opacus._observe import STEP_METHODS, ExampleCounter
from lastiter_plugins.adapters.opacus._projection import PROJECTIONS, STAMPS

if TYPE_CHECKING:
    from lastiter_plugins.adapters.opacus._steps import StepChecks

#: exact types whose objects are immutable: while an attribute or param-group entry still refers
#: to the same object of one of these types, its value has not changed
_IMMUTABLE_TYPES = frozenset((int, float, bool, str, type(None)))
_GROUP_KEYS = ("lr", "momentum", "weight_decay", "nesterov", "maximize")
#: up to this many parameter tensors the comparisons are unrolled; beyond, loops (a step of such a
#: model is long enough that their cost does not matter)
UNROLL = 12

FastStep = Callable[[Any], bool]


def compile_fast_step(
    optim: Any,
    checks: StepChecks,
    facts: LoaderFacts,
    watch: LoaderWatch,
    counter: ExampleCounter | None,
    history: list,
    noise_multiplier: float,
    sample_rate: float,
) -> FastStep | None:
    """The usual step's checks for ``optim`` as accepted by a full check just now, or None
    when a value read is not of an immutable type (a tensor learning rate can change in
    place), so that every step is checked in full.

    ``history`` is the accountant's Opacus-format history, which the function extends by
    one step when it accepts one (as ``LastIterateAccountant.step`` would).
    """
    base = optim.original_optimizer
    groups = base.param_groups
    try:
        pinned = [
            (group, *(group[key] for key in _GROUP_KEYS), group["params"], tuple(group["params"]),
             tuple(p.requires_grad for p in group["params"]))
            for group in groups
        ]  # fmt: skip
        values = [optim.max_grad_norm, optim.noise_multiplier, optim.loss_reduction, optim.expected_batch_size]
        world = optim.world_size if type(optim) is DistributedDPOptimizer else None
    except (AttributeError, KeyError, TypeError):
        return None
    values += [world] + [v for group in pinned for v in group[1:6]]
    if not pinned or not all(type(v) in _IMMUTABLE_TYPES and v == v for v in values):  # (v == v: not NaN)
        return None
    params, others = tuple(checks.params), tuple(checks.others)
    if not params:
        return None
    pins = watch.fast_pins()
    # the parameters' versions compared here when nothing projects them; else verify_parameters
    # (which tells the projection's own writes apart)
    plain = checks.reg.assumptions.diameter is None and PROJECTIONS.get(base) is None
    single = len(pinned) == 1 and len(pinned[0][7]) <= UNROLL
    shape = _Shape(
        single_group=len(pinned[0][7]) if single else None,
        params=len(params) if plain and len(params) <= UNROLL else None,
        others=bool(others),
        loader=None if pins is None else "tensors" if pins.tensors is not None else "len",
        permutation=pins is not None and pins.permutation is not None,
        plain=plain,
        fixed=facts.batch_size is not None,
        counter=counter is not None,
        world=world is not None,
    )
    constants: dict[str, Any] = {
        "optim": optim, "kind": type(optim), "clip": optim.max_grad_norm, "noise": optim.noise_multiplier,
        "reduction": optim.loss_reduction, "expected": optim.expected_batch_size, "world": world, "base": base,
        "sgd": type(base), "base_step": vars(base).get("step"), "groups": groups, "ngroups": len(groups),
        "pinned": tuple(pinned), "skipped": internals.skip_flag, "own_pre_hooks": internals.own_step_pre_hooks,
        "global_pre_hooks": internals.GLOBAL_STEP_PRE_HOOKS, "watch": watch, "p0": params[0],
        "tensor": torch.Tensor, "counter": counter, "history": history, "z": noise_multiplier, "q": sample_rate,
        "batch": facts.batch_size, "batches": facts.num_batches, "n": facts.dataset_size,
        "last": facts.batch_at(facts.num_batches - 1) if facts.batch_size is not None else None,
        "checks": checks, "record": checks.record, "params": params, "others": others,
        "version": internals.version,
    }  # fmt: skip
    if single:
        group, lr, momentum, decay, nesterov, maximize, members, tensors, flags = pinned[0]
        constants.update(group=group, lr=lr, momentum=momentum, decay=decay, nesterov=nesterov, maximize=maximize,
                         members=members)  # fmt: skip
        constants.update({f"m{i}": t for i, t in enumerate(tensors)})
        constants.update({f"f{i}": f for i, f in enumerate(flags)})
    if shape.params is not None:
        constants.update({f"v{i}": p for i, p in enumerate(params)})
    if pins is not None:
        constants.update(zip(("ref", "dataset", "tensors", "size", "batch_sampler", "sampler", "sampler_kind",
                              "batch_size", "drop_last", "permutation"), pins, strict=True))  # fmt: skip
    return _function(_code(shape), constants)


#: ``record[1]`` when the post-hook found another post-hook in front of it (which could have written
#: to the parameters before the record): the full check refuses with it
NOT_FIRST = (
    "the accountant's step post-hook must run first after the update, to record the parameters the update "
    "leaves. Found another post-hook moved in front of it. Do not reorder the optimizer's hooks."
)


def compile_version_record(record: list, params: tuple, others: tuple) -> Callable[[Any, Any, Any], None]:
    """The step post-hook of :class:`StepChecks`: after an accounted step (``record[0]``, set
    by the step), ``record[1] = (next(STAMPS), versions of params, versions of others)`` if it
    runs first among the optimizer's post-hooks (``record[2]``: its handle's id), else
    :data:`NOT_FIRST`."""
    if len(params) > UNROLL:
        versions = "tuple([_version(p) for p in _params])"
    else:
        versions = "(" + "".join(f"_version(_v{i}), " for i in range(len(params))) + ")"
    if not others:
        rest = "()"
    elif len(others) > UNROLL:
        rest = "tuple([_version(p) for p in _others])"
    else:
        rest = "(" + "".join(f"_version(_o{i}), " for i in range(len(others))) + ")"
    source = (
        "    if _record[0]:\n"
        "        _record[0] = False\n"
        "        if next(iter(_post_hooks(optimizer))) == _record[2]:  # first: nothing wrote before this record\n"
        f"            _record[1] = (next(_stamps), {versions}, {rest})\n"
        "        else:\n"
        "            _record[1] = _not_first\n"
    )
    constants: dict[str, Any] = {"record": record, "stamps": STAMPS, "version": internals.version, "params": params,
                                 "others": others, "post_hooks": internals.own_step_post_hooks,
                                 "not_first": NOT_FIRST}  # fmt: skip
    constants.update({f"v{i}": p for i, p in enumerate(params)})
    constants.update({f"o{i}": p for i, p in enumerate(others)})
    return _function(_compiled("after_step", ("optimizer", "args", "kwargs"), source), constants)


def _function(compiled: tuple[types.CodeType, tuple[str, ...]], constants: dict[str, Any]) -> Any:
    code, names = compiled
    return types.FunctionType(code, globals(), code.co_name, tuple(constants[name] for name in names))


class _Shape(NamedTuple):
    """What the generated source depends on (the cache key)."""

    single_group: int | None  # the number of tensors of the one param group (unrolled), or None: a loop
    params: int | None  # the number of trainable tensors whose versions are compared unrolled, or None: a loop
    others: bool  # module parameters the optimizer does not train (their versions are compared too)
    loader: str | None  # the dataset's length read as "tensors" (a TensorDataset's) or "len"; None: the loader
    # is not inlined (LoaderWatch.unchanged())
    permutation: bool  # an inlined ShuffleOnceSampler (else a SequentialSampler over the dataset)
    plain: bool  # no projection: the versions are compared here (else StepChecks.verify_parameters)
    fixed: bool  # a fixed batch plan (else Poisson: at most n examples)
    counter: bool  # the examples entering the module are counted
    world: bool  # DistributedDPOptimizer: its world size is compared


#: the constants of the generated source: names with a leading underscore, not attributes or strings
_CONSTANT = re.compile(r"(?<![\w.'\"])_([a-z][a-z0-9_]*)")


@functools.lru_cache(maxsize=64)
def _code(shape: _Shape) -> tuple[types.CodeType, tuple[str, ...]]:
    """The code object of the fast step for ``shape``, and the names of its constants."""
    return _compiled("fast_step", ("optim",), _source(shape))


@functools.lru_cache(maxsize=64)
def _compiled(name: str, arguments: tuple[str, ...], source: str) -> tuple[types.CodeType, tuple[str, ...]]:
    """The code object of the function ``name(*arguments)`` with body ``source`` (indented by 4),
    and the names of its constants (its default arguments after ``arguments``: the names in
    ``source`` with a leading underscore, without it), in order."""
    names = tuple(sorted(set(_CONSTANT.findall(source))))
    header = f"def {name}(" + ", ".join([*arguments, *(f"_{constant}=None" for constant in names)]) + "):\n"
    namespace: dict[str, Any] = {}
    exec(compile(header + source, f"<lastiter {name}>", "exec"), namespace)
    return namespace[name].__code__, names


def _source(shape: _Shape) -> str:
    """The body of the fast step for ``shape`` (indented by 4; names with a leading underscore
    are the constants)."""
    lines = ["    try:"]
    add = lines.append
    # what observe() and check_sgd read
    add("        attrs = optim.__dict__")
    add("        if (")
    add("            optim is not _optim or type(optim) is not _kind or optim.max_grad_norm is not _clip")
    add("            or optim.noise_multiplier is not _noise or optim.loss_reduction is not _reduction")
    add("            or optim.expected_batch_size is not _expected or optim.original_optimizer is not _base")
    # (Opacus' step methods not overridden on the object: STEP_METHODS of _observe)
    overrides = " or ".join(f"{name!r} in attrs" for name in STEP_METHODS)
    add(f"            or _skipped(optim) or {overrides}")
    if shape.world:
        add("            or optim.world_size is not _world")
    add("            or type(_base) is not _sgd or _base.param_groups is not _groups")
    add("            or _own_pre_hooks(_base) or _global_pre_hooks or _base.__dict__.get('step') is not _base_step")
    add("        ):")
    add("            return False")
    # the param groups and the parameters they train (trainable() of the full check)
    if shape.single_group is not None:
        k = shape.single_group
        add("        if (")
        add("            len(_groups) != 1 or _groups[0] is not _group or _group['lr'] is not _lr")
        add("            or _group['momentum'] is not _momentum or _group['weight_decay'] is not _decay")
        add("            or _group['nesterov'] is not _nesterov or _group['maximize'] is not _maximize")
        add(f"            or _group['params'] is not _members or len(_members) != {k}")
        for i in range(k):
            add(f"            or _members[{i}] is not _m{i} or _m{i}.requires_grad is not _f{i}")
        add("        ):")
        add("            return False")
    else:
        add("        if len(_groups) != _ngroups:")
        add("            return False")
        add("        i = 0")
        add("        for group, lr, momentum, decay, nesterov, maximize, members, tensors, flags in _pinned:")
        add("            if (")
        add("                _groups[i] is not group or group['lr'] is not lr or group['momentum'] is not momentum")
        add("                or group['weight_decay'] is not decay or group['nesterov'] is not nesterov")
        add("                or group['maximize'] is not maximize or group['params'] is not members")
        add("                or len(members) != len(tensors)")
        add("            ):")
        add("                return False")
        add("            j = 0")
        add("            for p in members:")
        add("                if p is not tensors[j] or p.requires_grad is not flags[j]:")
        add("                    return False")
        add("                j += 1")
        add("            i += 1")
    # the loader (LoaderWatch.unchanged; inlined for the loaders LoaderWatch.fast_pins covers)
    if shape.loader is None:
        add("        if not _watch.unchanged():")
        add("            return False")
    else:
        add("        loader = _ref()")
        add("        if (")
        add("            loader is None or loader.dataset is not _dataset")
        add("            or loader.batch_sampler is not _batch_sampler")
        add("            or _batch_sampler.sampler is not _sampler or type(_sampler) is not _sampler_kind")
        add("            or _batch_sampler.batch_size is not _batch_size or _batch_sampler.drop_last is not _drop_last")
        if shape.loader == "tensors":  # TensorDataset.__len__ is its first tensor's length
            add("            or _dataset.tensors is not _tensors or _tensors[0].shape[0] != _size")
        else:
            add("            or len(_dataset) != _size")
        if shape.permutation:  # ShuffleOnceSampler: a tuple, its length fixed
            add("            or _sampler._permutation is not _permutation")
        else:  # SequentialSampler: its length is the dataset's
            add("            or _sampler.data_source is not _dataset")
        add("        ):")
        add("            return False")
    # the examples whose clipped gradients the step sums: one pass, one per example, the batch planned
    add("        samples = _p0.grad_sample")
    add("        if type(samples) is not _tensor:")
    add("            return False")
    add("        count = samples.shape[0]")
    if shape.counter:
        add("        if not _counter.unknown and _counter.count != count:")
        add("            return False")
    add("        if len(_history) != 1:")
    add("            return False")
    add("        z, q, steps = _history[0]")
    add("        if z != _z or q != _q:")
    add("            return False")
    if shape.fixed:
        add("        if count != (_last if steps % _batches == _batches - 1 else _batch):")
    else:  # Poisson: at most the dataset
        add("        if count > _n:")
    add("            return False")
    # the parameters: written only by the accounted steps since the last one
    if shape.plain:
        add("        after = _record[1]")
        # (a projection attached since moves the parameters after this record, or leaves them as they are)
        add("        if after is None:")
        add("            return False")
        if shape.params is not None:
            versions = ", ".join(f"_version(_v{i})" for i in range(shape.params))
            add(f"        if ({versions},) != after[1]:")
            add("            return False")
        else:
            add("        expected, i = after[1], 0")
            add("        for p in _params:")
            add("            if _version(p) != expected[i]:")
            add("                return False")
            add("            i += 1")
        if shape.others:
            add("        expected, i = after[2], 0")
            add("        for p in _others:")
            add("            if _version(p) != expected[i]:")
            add("                return False")
            add("            i += 1")
    else:
        add("        _checks.verify_parameters(steps)  # raises on a violation: the full check then raises it")
    # accept: record the step as LastIterateAccountant.step would, and start counting the next one
    add("        _record[0] = True  # pending: the post-hook records the versions this step leaves")
    add("        _history[0] = (z, q, steps + 1)")
    if shape.counter:
        add("        _counter.count = 0")
        add("        _counter.unknown = False")
    add("        return True")
    add("    except Exception:  # anything unexpected: the full check decides, and raises what it raises")
    add("        return False")
    return "\n".join(lines) + "\n"
