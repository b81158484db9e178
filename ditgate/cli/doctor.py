"""``ditgate doctor``: every form, available or not, with the reason, on this machine."""

from __future__ import annotations

import dataclasses
import json

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..forms import describe_forms
from ..forms.fa4 import use_fa4_disk_cache
from ..gate.cache import default_cache_path
from ..gate import environment
from ..sparse.families import FAMILIES, FAMILIES_WITH_PADDING_MASKS


def doctor(as_json: bool = False) -> int:
    infos = describe_forms()
    env = environment()
    families = sorted(FAMILIES)  # the denoiser classes whose token layouts the sparse stage reads
    if as_json:
        print(json.dumps({"environment": env, "forms": [dataclasses.asdict(i) for i in infos],
                          "timing_cache": str(default_cache_path()), "fa4_kernel_cache": use_fa4_disk_cache(),
                          "sparse_layouts": families, "padding_masks": sorted(FAMILIES_WITH_PADDING_MASKS)},
                         indent=2, default=str))
        return 0
    console = Console()
    where = env.get("gpu") or f"CPU ({env.get('cpu')})"
    cap = f", capability {tuple(env['capability'])}" if env.get("capability") else ""
    console.print(f"[bold]ditgate doctor[/bold]: {where}{cap}; torch {torch.__version__}, "
                  f"diffusers {env['packages'].get('diffusers')}, triton {env['packages'].get('triton')}")
    table = Table(show_lines=False)
    for col in ("form", "precision", "available", "version", "reason / envelope"):
        table.add_column(col, overflow="fold")
    for i in infos:
        e = i.envelope
        envelope = (f"{','.join(e['devices'])}; {','.join(e['dtypes'])}; head dims {e['head_dims']}; "
                    f"masks {','.join(e['masks'])}" + (f"; cc >= {e['min_capability']}" if e['min_capability'] else ""))
        table.add_row(i.name, i.precision, "yes" if i.available else "no", i.version or "-",
                      escape(envelope) if i.available else f"{escape(i.reason)}\n[dim]{escape(envelope)}[/dim]")
    console.print(table)
    n = sum(i.available for i in infos)
    console.print(f"{n} of {len(infos)} forms available here.")
    console.print(f"Timing cache: {default_cache_path()}; flash-attn-4's compiled kernels kept on disk: "
                  f"{escape(use_fa4_disk_cache())}.")
    console.print(f"Sparse stage layouts read for: {', '.join(families)}; any other class stays dense. Masks that "
                  f"hide only padding, served unmasked over the keys before it: "
                  f"{', '.join(sorted(FAMILIES_WITH_PADDING_MASKS))}.")
    return 0
