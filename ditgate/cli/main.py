"""``ditgate`` command line: doctor, demo, bench."""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="every form, available or not, with the reason, on this machine")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_run_doctor)


def _run_doctor(args) -> int:
    from .doctor import doctor

    return doctor(as_json=args.json)


def _add_demo(sub) -> None:
    from ..models.presets import DEMO_PRESETS, PRESETS

    p = sub.add_parser("demo", help="attach ditgate to built-in tiny diffusers models and explain the plan")
    p.add_argument("--models", nargs="+", default=list(DEMO_PRESETS), choices=sorted(PRESETS), metavar="PRESET",
                   help=f"model presets (default: {' '.join(DEMO_PRESETS)})")
    p.add_argument("--profile", default=None, help="quality (default), balanced, speed (default with --sparse)")
    p.add_argument("--forms", nargs="+", default=None, help="candidate forms (outrank the profile)")
    p.add_argument("--static", action="store_true", help="no measuring: first usable form by priority")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--out", default="ditgate-out", help="folder for the JSON reports (default: ditgate-out)")
    p.add_argument("--sparse", type=float, default=None, metavar="BUDGET",
                   help="also run the sparse stage at this budget on every step and layer (block-sparse forms "
                        "become candidates; the gate measures them and says why where they lose)")
    p.add_argument("--sparse-block", type=int, default=16, help="tile size of the sparse stage (default 16: tiny models)")
    p.set_defaults(func=_run_demo)


def _run_demo(args) -> int:
    from .demo import demo

    sparse = None
    if args.sparse is not None:
        from ..sparse.schedule import BudgetSchedule
        from ..sparse.stage import SparseSetting

        try:
            from ..forms import SPARSE_PRIORITY

            # every consumer, the compiled flex one too: on a CPU it is the only one that runs
            sparse = SparseSetting(BudgetSchedule(args.sparse, dense_steps=0, dense_layers=0), block=args.sparse_block,
                                   forms=SPARSE_PRIORITY)
        except ValueError as exc:
            print(f"ditgate demo: {exc}", file=sys.stderr)
            return 2
    profile = args.profile or ("speed" if sparse is not None else "quality")
    try:
        return demo(args.models, profile=profile, forms=args.forms, static=args.static, device=args.device,
                    out=args.out, sparse=sparse)
    except ValueError as exc:  # e.g. a sparse setting under a profile that allows exact forms only
        print(f"ditgate demo: {exc}", file=sys.stderr)
        return 2


def _add_bench(sub) -> None:
    from .bench import add_bench_parsers

    add_bench_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ditgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="-v: gate progress, -vv: debug")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_doctor(sub)
    _add_demo(sub)
    _add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    from rich.logging import RichHandler

    logging.basicConfig(level=level, format="%(message)s",
                        handlers=[RichHandler(console=Console(stderr=True), show_path=False)])
    logging.getLogger("diffusers").setLevel(logging.ERROR)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
