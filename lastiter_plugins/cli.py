r"""The ``lastiter`` command line: a thin layer over the keyword API.

    lastiter rdp --bound ID --orders 2,4,8 <params> [--json]
    lastiter epsilon --bound ID --delta 1e-5 <params> [--json]
    lastiter bounds <params> [--delta 1e-5] [--json]
    lastiter calibrate --bound ID --target-epsilon 1 --delta 1e-5 <params> [--json]
    lastiter compare [...]            (see ``lastiter compare --help``)

User errors exit with status 2 and one line on stderr. JSON output never
contains NaN or Infinity (non-finite numbers are written as null).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from lastiter_plugins import api, registry
from lastiter_plugins.calibration import calibrate_noise
from lastiter_plugins.config import Relation, Sampling

EXIT_USAGE = 2


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise UsageError(message)


class _Renamed(argparse.Action):
    """A flag that was renamed: refused with the new name."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(
            f"{option_string} was renamed: use --gradient-norms-within-clip, which asserts that every "
            "per-example gradient norm is <= C on the whole domain (clipping never active)."
        )


def _orders(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"orders must be comma-separated numbers > 1, e.g. 2,4,8. Found {text!r}."
        ) from None


def add_training_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The training-configuration and loss-assumption flags (mirroring the keyword API)."""
    g = parser.add_argument_group("training run")
    g.add_argument("--dataset-size", type=int, required=required, help="n, number of examples")
    g.add_argument("--batch-size", type=int, required=required, help="b, (expected) batch size")
    g.add_argument("--noise-multiplier", type=float, help="z: noise std on the clipped-gradient sum is z*C")
    g.add_argument("--clip-norm", type=float, default=1.0, help="C, per-example clipping norm (default 1)")
    g.add_argument("--learning-rate", type=float, help="eta, constant plain-SGD step size")
    steps = g.add_mutually_exclusive_group(required=required)
    steps.add_argument("--steps", type=int, help="T, optimizer steps")
    steps.add_argument("--epochs", type=int, help="E passes = E*ceil(n/b) steps")
    g.add_argument(
        "--sampling", choices=[s.value for s in Sampling], required=required, help="what the data pipeline does"
    )
    g.add_argument(
        "--relation",
        choices=[r.value for r in Relation],
        default=Relation.REPLACE_ONE.value,
        help="neighbouring relation (default replace_one)",
    )
    a = parser.add_argument_group("declared loss assumptions")
    a.add_argument("--smoothness", type=float, help="M, smoothness (upper curvature) of every per-example loss")
    a.add_argument("--weak-convexity", type=float, default=0.0, help="m >= 0 (0 = convex)")
    a.add_argument("--strong-convexity", type=float, default=0.0, help="lam >= 0")
    a.add_argument("--diameter", type=float, help="D of the set the iterates are projected onto (default: none)")
    a.add_argument(
        "--gradient-norms-within-clip",
        action="store_true",
        default=False,
        help="assert that every per-example gradient norm is <= C on the whole domain (clipping never active)",
    )
    a.add_argument("--no-clipping", action=_Renamed, nargs=0, help=argparse.SUPPRESS)


def params_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword-API parameters carried by parsed arguments."""
    out = {}
    for key in api.PARAMETERS:
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    return out


def _bound_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bound", required=True, choices=registry.BOUND_IDS, metavar="ID", help="bound id or best")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_json_safe(v) for v in value]
    return value


def dump_json(obj: Any) -> str:
    return json.dumps(_json_safe(obj), allow_nan=False, indent=2)


def _fmt(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.6g}"


def _cmd_rdp(args) -> str:
    params = params_from_args(args)
    values = api.rdp(args.bound, args.orders, **params)
    relation = params.get("relation", Relation.REPLACE_ONE.value)
    if args.bound != registry.BEST:
        relation = registry.BOUNDS[args.bound].relation_for(Sampling.parse(params["sampling"])).value
    if args.json:
        return dump_json({"bound": args.bound, "orders": args.orders, "rdp": values.tolist(), "relation": relation})
    lines = [f"RDP of {args.bound} ({relation} neighbours; final model only), nats:"]
    lines += [f"  order {a:g}: {_fmt(v)}" for a, v in zip(args.orders, values, strict=True)]
    return "\n".join(lines)


def _cmd_epsilon(args) -> str:
    result = api.account(args.bound, args.delta, args.orders, **params_from_args(args))
    return dump_json(result.to_dict()) if args.json else str(result)


def _cmd_bounds(args) -> str:
    params = params_from_args(args)
    table = api.applicable_bounds(**params)
    rows = []
    for bid, app in table.items():
        row = {
            "bound": bid,
            "applies": app.applies,
            "relation": app.relation.value if app.relation else None,
            "reason": app.reason or None,
            "reference": app.reference,
            "epsilon": None,
            "order": None,
        }
        if app.applies and args.delta is not None and params.get("noise_multiplier") is not None:
            result = api.account(bid, args.delta, args.orders, **params)
            row.update(epsilon=result.epsilon, order=result.order, winner=result.winner)
        rows.append(row)
    if args.json:
        return dump_json({"delta": args.delta, "bounds": rows})
    lines = [f"{'bound':28} {'applies':7} {'relation':17} {'epsilon':>12}  note"]
    for row in rows:
        eps = "" if row["epsilon"] is None else _fmt(row["epsilon"])
        note = (
            row["reason"]
            if not row["applies"]
            else (f"order {row['order']:g}" if row["order"] else "")
            + (f", via {row['winner']}" if row.get("winner") not in (None, row["bound"]) else "")
        )
        lines.append(
            f"{row['bound']:28} {'yes' if row['applies'] else 'no':7} {row['relation'] or '-':17} {eps:>12}  {note}"
        )
    lines.append("Epsilons protect the final model only (composition: every iterate); never mix relations.")
    return "\n".join(lines)


def _cmd_calibrate(args) -> str:
    params = params_from_args(args)
    z = calibrate_noise(args.bound, args.target_epsilon, args.delta, orders=args.orders, **params)
    if args.json:
        return dump_json({"bound": args.bound, "noise_multiplier": z, "target_epsilon": args.target_epsilon})
    target = f"epsilon <= {args.target_epsilon:g} at delta = {args.delta:g}"
    return f"noise_multiplier = {z:.6g} reaches {target} ({args.bound})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lastiter", description="Last-iterate Renyi-DP accountants for DP-SGD.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("rdp", help="RDP epsilon (nats) at given orders")
    _bound_argument(p)
    p.add_argument("--orders", type=_orders, required=True, help="comma-separated, e.g. 2,4,8")
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_rdp)

    p = sub.add_parser("epsilon", help="(epsilon, delta) of one bound, or of best")
    _bound_argument(p)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--orders", type=_orders, help="default: the library's grid 1.01 .. 1e4")
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_epsilon)

    p = sub.add_parser("bounds", help="every bound: applies or why not, relation, epsilon")
    p.add_argument("--delta", type=float, help="also compute epsilon at this delta (needs --noise-multiplier)")
    p.add_argument("--orders", type=_orders)
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_bounds)

    p = sub.add_parser("calibrate", help="smallest noise multiplier reaching a target epsilon")
    _bound_argument(p)
    p.add_argument("--target-epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--orders", type=_orders)
    add_training_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_calibrate)

    try:
        from lastiter_plugins import compare
    except ImportError:  # the compare module is optional while it is being built
        compare = None
    if compare is not None:
        p = sub.add_parser("compare", help="side-by-side comparison of every accountant")
        compare.configure_parser(p)
        p.set_defaults(run=compare.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lastiter`` console script. Returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            output = args.run(args)
        for w in caught:
            print(f"lastiter: warning: {w.message}", file=sys.stderr)
    except UsageError as exc:
        print(f"lastiter: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # NotApplicableError, CalibrationError and invalid values
        print(f"lastiter: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE
    if output:
        print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
