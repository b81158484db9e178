"""``ditgate bench overhead``: what the router adds, on the host, to each attention call in the steady state.

A short-sequence model makes many small attention calls; if routing one cost more than a fast form saves, the
model would lose by being routed. So this times one tiny call (B1 x 64 tokens x 2 heads x 16 on the CPU by default)
three ways, interleaved, on one thread:

- ``direct``: torch SDPA on the B, H, S, D views, called by hand (the kernel and nothing else);
- ``routed``: the same call through the router entry a routed processor calls in place of diffusers'
  ``dispatch_attention_fn`` (site lookup, the route cached for the call's signature, ledger count, the views),
  served by a form that calls that same SDPA;
- ``host``: diffusers' own ``dispatch_attention_fn`` (what the host pays for its dispatch, for comparison).

``overhead`` = routed - direct, per call, from the least disturbed of the rounds (the minimum: on a shared machine
the others measure other people's work). The routes resolved during the timed calls are reported too: a steady
state resolves none (every call a cache hit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..forms import AttentionInputs, Availability, Form, FormSpec, MaskKind, Precision
from ..hosts import Convention, find_attention_modules, plan_interception
from ..models.presets import get_preset
from ..router import ModuleRouter, RouterContext, StaticChooser

BUDGET_US = 30.0  # issue 31: the router may add at most this per call


class _DirectSdpa(Form):
    """torch SDPA with no backend pinned: the form whose ``run`` is exactly the ``direct`` call."""

    spec = FormSpec(name="direct_sdpa", precision=Precision.EXACT, description="torch SDPA, unpinned (benchmark)",
                    devices=frozenset({"cpu", "cuda"}), dtypes=frozenset({"float32", "float16", "bfloat16"}),
                    mask_kinds=frozenset({MaskKind.NONE}))

    def _probe(self) -> Availability:
        return Availability(True, "", torch.__version__)

    def run(self, inputs: AttentionInputs) -> torch.Tensor:
        return F.scaled_dot_product_attention(inputs.query, inputs.key, inputs.value, scale=inputs.scale)


@dataclass(frozen=True)
class Overhead:
    device: str
    shape: tuple[int, int, int, int]  # B, S, H, D as the host passes it
    calls_per_round: int
    rounds: int
    direct_us: float
    routed_us: float
    host_us: float
    overhead_us: float  # routed - direct
    resolved_while_timed: int  # routes resolved during the timed calls (0: every call hit the cache)
    budget_us: float = BUDGET_US

    @property
    def within_budget(self) -> bool:
        return self.overhead_us <= self.budget_us


def _per_call_us(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def measure_overhead(device: str = "cpu", shape: tuple[int, int, int, int] = (1, 64, 2, 16), calls: int = 2000,
                     rounds: int = 7) -> Overhead:
    """Time the three ways of one call (see the module docstring); ``shape`` is B, S, H, D."""
    dev = torch.device(device)
    model = get_preset("tiny-wan").build(seed=0)
    found = find_attention_modules(model)[0]
    processor = found.module.processor
    form = _DirectSdpa()
    context = RouterContext(forms={form.name: form}, chooser=StaticChooser((form.name,)), observe=lambda event: None)
    router = ModuleRouter(context, found, processor, plan_interception(processor).conventions)
    entry = router.entries()[Convention.DISPATCH]
    original = router.originals[Convention.DISPATCH]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).to(dev) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def routed():
        router.begin_invocation()  # what the routed processor does at the start of each invocation
        return entry(q, k, v)

    ways = {"direct": lambda: F.scaled_dot_product_attention(qt, kt, vt), "routed": routed,
            "host": lambda: original(q, k, v)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one call's latency, not the scheduling of a shared machine's cores
    try:
        with torch.no_grad():
            for fn in ways.values():  # warm-up; the routed call resolves its route here
                _per_call_us(fn, max(10, calls // 10), dev)
            resolved = router.sites[0].resolved
            best = {name: float("inf") for name in ways}
            for _ in range(rounds):
                for name, fn in ways.items():
                    best[name] = min(best[name], _per_call_us(fn, calls, dev))
            resolved = router.sites[0].resolved - resolved
    finally:
        torch.set_num_threads(threads)
    return Overhead(device=str(dev), shape=tuple(shape), calls_per_round=calls, rounds=rounds,
                    direct_us=best["direct"], routed_us=best["routed"], host_us=best["host"],
                    overhead_us=best["routed"] - best["direct"], resolved_while_timed=resolved)


def add_overhead_parser(bsub) -> None:
    o = bsub.add_parser("overhead", help="the router's host-side cost per attention call (steady state)")
    o.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    o.add_argument("--shape", default="1,64,2,16", metavar="B,S,H,D", help="the call (default 1,64,2,16)")
    o.add_argument("--calls", type=int, default=2000, help="calls per timed round (default 2000)")
    o.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    o.add_argument("--json", action="store_true", help="print JSON instead of a line")
    o.set_defaults(func=run)


def run(args) -> int:
    shape = tuple(int(n) for n in args.shape.split(","))
    if len(shape) != 4:
        print(f"ditgate bench overhead: --shape needs B,S,H,D, got {args.shape!r}", file=sys.stderr)
        return 2
    result = measure_overhead(args.device, shape, args.calls, args.rounds)
    if args.json:
        print(json.dumps(dict(asdict(result), within_budget=result.within_budget), indent=2))
    else:
        print(f"router overhead on {result.device}, call {list(result.shape)} (B,S,H,D): "
              f"{result.overhead_us:.1f} us/call (routed {result.routed_us:.1f}, direct {result.direct_us:.1f}, "
              f"diffusers' dispatch {result.host_us:.1f}); budget {result.budget_us:.0f} us: "
              f"{'within' if result.within_budget else 'OVER'}; routes resolved while timed: "
              f"{result.resolved_while_timed}")
    return 0 if result.within_budget else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m ditgate.cli.bench_overhead")
    add_overhead_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["overhead", *sys.argv[1:]])
    sys.exit(parsed.func(parsed))
