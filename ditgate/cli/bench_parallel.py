"""``bench model`` under diffusers' context parallelism: stock against ditgate, the same parallel config for both.

Run once per GPU (``python -m torch.distributed.run --nproc-per-node 2 -m ditgate.cli.bench_parallel ...``): every
rank builds the same random-weights model, ``enable_parallelism`` shards it (Ulysses, ring, or both), and the rows
of ``bench_model`` run on every rank in lockstep - the stock backends that support context parallelism, then each
ditgate profile, calibrated under the same configuration (its verdicts agreed across ranks) and re-attached from
its receipt each round. Inputs are drawn from the same seeds on every rank, as context parallelism requires. Rank
0 prints the table and writes the JSON (rows, every plan's explain, the parallel configuration); the cosine of
each row is against the stock ``native`` row's output, which diffusers gathers whole on every rank.

``wan-14b-720p-81f`` (Wan 2.1 14B at 1280x720, 81 frames: 75600 tokens) is defined here from the 480p preset, the
length one GPU struggles with.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

from ..models.presets import PRESETS, ModelPreset, get_preset

WAN_14B_720P = dataclasses.replace(get_preset("wan-14b-480p-81f"), name="wan-14b-720p-81f",
                                   description="Wan 2.1 14B, 1280x720, 81 frames (75600 tokens)",
                                   geometry=dict(frames=21, height=90, width=160, text=512, patch_area=4))
PARALLEL_BACKENDS = ("native", "_native_cudnn", "_native_flash")  # diffusers 0.42's context-parallel backends here
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def preset_named(name: str) -> ModelPreset:
    return WAN_14B_720P if name == WAN_14B_720P.name else get_preset(name)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch.distributed.run --nproc-per-node N -m ditgate.cli.bench_parallel",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=WAN_14B_720P.name, choices=sorted([*PRESETS, WAN_14B_720P.name]),
                   metavar="PRESET", help=f"a bench model preset, or {WAN_14B_720P.name} (the default)")
    p.add_argument("--layers", type=int, default=8, metavar="N",
                   help="cut each stack of blocks to its first N (default 8; 0 keeps them all)")
    p.add_argument("--ulysses", type=int, default=None, help="Ulysses degree (default: the world size)")
    p.add_argument("--ring", type=int, default=1, help="ring degree (default 1)")
    p.add_argument("--backends", nargs="*", default=list(PARALLEL_BACKENDS), help="stock diffusers backends")
    p.add_argument("--profiles", nargs="*", default=["quality", "speed"], help="ditgate profiles")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--steps", type=int, default=1, help="forwards per timed sample (default 1)")
    p.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    p.add_argument("--out", default="ditgate-out", help="folder for the JSON (default: ditgate-out)")
    return p


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist
    from diffusers import ContextParallelConfig
    from rich.console import Console

    from .bench_model import bench_model
    from .bench_output import print_table, write_json

    args = _parser().parse_args(argv)
    if not torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        print("bench_parallel needs CUDA and one process per GPU (torch.distributed.run --nproc-per-node N)",
              file=sys.stderr)
        return 2
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    ulysses = args.ulysses or world // args.ring
    preset = preset_named(args.preset)
    if args.layers:
        preset = preset.with_layers(args.layers)
    dtype = _DTYPES[args.dtype]
    console = Console(width=200)
    try:
        model = preset.build(device, dtype)
        config = ContextParallelConfig(ulysses_degree=ulysses, ring_degree=args.ring)
        model.enable_parallelism(config=config)
        progress = (lambda text: console.print(f"[{rank}] {text}")) if rank == 0 else None
        rows, extra = bench_model(preset, model, device, dtype, tuple(args.backends), args.profiles, args.rounds,
                                  args.steps, progress=progress)
        if rank == 0:
            title = (f"ditgate bench parallel {preset.name}: ulysses {ulysses} x ring {args.ring} over {world} GPUs "
                     f"({args.dtype})")
            print_table(console, title, rows)
            command = "python -m torch.distributed.run --nproc-per-node {} -m ditgate.cli.bench_parallel {}".format(
                world, " ".join(sys.argv[1:] if argv is None else argv))
            path = write_json(Path(args.out) / f"bench-parallel-{preset.name}-u{ulysses}r{args.ring}.json", command,
                              rows, {"preset": preset.name, "parallel": {"ulysses_degree": ulysses,
                                                                          "ring_degree": args.ring,
                                                                          "world_size": world}, **extra})
            for r in rows:
                if ";" in r.detail:
                    console.print(f"{r.name}: {r.detail.split('; ', 1)[1]}")
            console.print(f"JSON: {path}")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
