"""Finding the linear sites of a denoiser, by structure, with the role each plays.

A linear site is a module whose forward is ``torch.nn.Linear``'s own (a subclass that overrides it does more than a
product, and is left alone). It is named by its module path; where PEFT wrapped it for a LoRA (a module with a
``base_layer``), the site is the wrapped base layer, named by the wrapper's path, so that the name stays the same
whether a LoRA was loaded before attach, after it, or unloaded again; the adapters' own ``lora_A`` / ``lora_B``
linears are never sites (the LoRA branch runs at full precision beside whatever serves the base).

Roles, read from where the linear sits (never from class names):
- ``attn.q`` / ``attn.k`` / ``attn.v`` / ``attn.out``, and ``attn.add_q`` ... ``attn.add_out`` for a joint
  attention's second stream: a linear under an attention module (one that owns a callable ``processor``), named by
  the attribute it hangs from (diffusers' convention: ``to_q``, ``add_k_proj``, ``to_out.0``, ``to_add_out``);
  ``attn.qkv`` / ``attn.kv`` / ``attn.add_qkv`` / ``attn.add_kv`` for the fused projections diffusers makes
  (``fuse_qkv_projections``: ``to_qkv``, ``to_kv``, ``to_added_qkv``, ``to_added_kv``); other linears there are
  ``attn.other``.
- ``feed-forward``: a linear under a feed-forward container (a module path component ``ff``, ``ffn``,
  ``ff_context`` ...: diffusers' name for the MLP of a block, however its activation is built).
- ``modulation``: the only linear of its parent beside a parameter-free activation (adaLN's SiLU -> Linear, a
  time projection): one row per sample, a product too small to win on a GPU.
- ``feed-forward``: any other linear inside a transformer block (a module holding an attention module).
- ``embedding`` / ``output``: outside every block, before the last block's modules (patch, text, time embedders)
  or after them (the final projection).

A site may be left to the host whatever it would measure (``LinearSite.left_alone``, with why): an offloading hook
replaced its forward, a LoRA is fused into its weight, or a DoRA adapter reads it (``left_alone``).

A site is also marked ``after_activation`` where its input is an activation's output by structure: a linear in a
sequence (``nn.ModuleList`` / ``nn.Sequential``, diffusers' ``FeedForward.net``) whose nearest earlier member, past
dropouts, is not a linear: an activation module, with or without its own projection (diffusers' GELU holds the
up projection). That is the feed-forward's down projection, where a compiled graph computes the activation again to
quantize the linear's input (``forms.linear`` quantizes such an input in a kernel of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION_ROLES = {
    "to_q": "attn.q", "to_k": "attn.k", "to_v": "attn.v", "to_out": "attn.out",
    "add_q_proj": "attn.add_q", "add_k_proj": "attn.add_k", "add_v_proj": "attn.add_v", "to_add_out": "attn.add_out",
    # diffusers' fused projections (``fuse_qkv_projections``): one product for Q, K and V (or K and V) of one input
    "to_qkv": "attn.qkv", "to_kv": "attn.kv", "to_added_qkv": "attn.add_qkv", "to_added_kv": "attn.add_kv",
}
# what a plan that does not measure quantizes unless told otherwise: the products that run on every token
TOKEN_ROLES: tuple[str, ...] = tuple(dict.fromkeys(ATTENTION_ROLES.values())) + ("feed-forward",)
ALL_ROLES: tuple[str, ...] = TOKEN_ROLES + ("attn.other", "modulation", "embedding", "output")
ROLE_GROUPS = {"token": TOKEN_ROLES, "all": ALL_ROLES}  # names a command line may give for several roles at once


def roles_named(names) -> tuple[str, ...]:
    """Role names with the groups of ``ROLE_GROUPS`` ("token", "all") spelled out, in order, each once; a name that
    is neither a role nor a group raises ValueError listing both."""
    unknown = [n for n in names if n not in ALL_ROLES and n not in ROLE_GROUPS]
    if unknown:
        raise ValueError(f"unknown linear role(s) {unknown}; roles: {', '.join(ALL_ROLES)}; groups: "
                         f"{', '.join(ROLE_GROUPS)}")
    return tuple(dict.fromkeys(r for n in names for r in ROLE_GROUPS.get(n, (n,))))


_ACTIVATIONS = (torch.nn.SiLU, torch.nn.GELU, torch.nn.ReLU, torch.nn.Tanh, torch.nn.Mish, torch.nn.Sigmoid)
_PASS_THROUGH = (torch.nn.Dropout, torch.nn.Identity)


@dataclass(frozen=True)
class LinearSite:
    """One linear of a denoiser: its path (prefixed by the component name), the module itself, and its role."""

    path: str
    module: torch.nn.Linear
    role: str
    after_activation: bool = False  # its input is an activation's output (see the module docstring)
    # why the plan leaves this module alone, whatever it would measure (``left_alone``), or ""
    left_alone: str = ""


def is_plain_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear) and type(module).forward is torch.nn.Linear.forward


def left_alone(module: torch.nn.Module, wrapper: torch.nn.Module | None) -> str:
    """Why a plan leaves this linear to the host whatever it would measure (empty when it may route it): what holds
    or reads its weight's values beside its own forward.

    - Something replaced its ``forward`` on the instance before attach: accelerate's hooks
      (``enable_sequential_cpu_offload``, ``cpu_offload``) and diffusers' leaf-level group offloading do, to bring
      the weights onto the device around each call and take them away after. The weights a form would quantize are
      then not there (a meta or an empty copy), and a routed forward in the hook's place would skip the hook.
    - Its PEFT wrapper (``wrapper``) has a LoRA fused into the weight (``fuse_lora``): unfusing later subtracts the
      delta from the weight's values, which a quantized site does not keep on the device.
    - Its PEFT wrapper carries a DoRA adapter (``use_dora``), which reads the weight's values on every call."""
    forward = module.__dict__.get("forward")
    own = getattr(forward, "__self__", None) is module and getattr(forward, "__func__", None) is type(module).forward
    if forward is not None and not own:  # (a hook taken off puts the module's own bound forward back: not a hook)
        if getattr(module, "_hf_hook", None) is not None:
            return ("accelerate's hook replaced its forward (cpu_offload, enable_sequential_cpu_offload: its weights "
                    "are brought in around each call), so the host keeps it; enable_model_cpu_offload moves whole "
                    "models instead")
        if getattr(module, "_diffusers_hook", None) is not None:
            return ("a diffusers hook replaced its forward (leaf-level group offloading moves its weights around each "
                    "call), so the host keeps it; enable the offloading after attach, or offload by block")
        return (f"its forward is replaced on the instance ({type(forward).__name__}: a hook?), so the host keeps it "
                "(attach before installing it)")
    if wrapper is not None and getattr(wrapper, "merged", False):
        return "a LoRA is fused into its weight (fuse_lora); unfuse_lora before attach to route it"
    if wrapper is not None and any(bool(v) for v in dict(getattr(wrapper, "use_dora", {}) or {}).values()):
        return "its DoRA adapter reads the weight's values on every call"
    return ""


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _attention_role(relative: str) -> str:
    head = relative.split(".")[0]
    return ATTENTION_ROLES.get(head, "attn.other")


def _is_modulation(parent: torch.nn.Module) -> bool:
    children = list(parent.children())
    linears = [c for c in children if isinstance(c, torch.nn.Linear) or isinstance(getattr(c, "base_layer", None),
                                                                                   torch.nn.Linear)]
    activation = any(isinstance(c, _ACTIVATIONS) and not any(True for _ in c.parameters()) for c in children)
    return len(linears) == 1 and activation


def find_linear_sites(model: torch.nn.Module, prefix: str = "") -> list[LinearSite]:
    """Every plain linear of ``model`` (PEFT's adapters excepted, its base layers included), with its role."""
    modules = dict(model.named_modules())
    attention = [name for name, m in modules.items() if callable(getattr(m, "processor", None))]
    blocks = {name.rpartition(".")[0] for name in attention if "." in name}
    wrapped = {name: m for name, m in modules.items() if isinstance(getattr(m, "base_layer", None), torch.nn.Module)}
    order = {name: i for i, name in enumerate(modules)}
    last_in_block = max((order[n] for n in modules if any(n.startswith(b + ".") for b in blocks)), default=-1)
    found: list[LinearSite] = []
    for name, module in modules.items():
        if not is_plain_linear(module):
            continue
        logical, wrapper = name, None
        inside_wrapper = [w for w in wrapped if name.startswith(w + ".")]
        if inside_wrapper:
            owner = max(inside_wrapper, key=len)
            if name != f"{owner}.base_layer":
                continue  # one of the adapter's own linears (lora_A, lora_B)
            logical, wrapper = owner, wrapped[owner]
        elif name in wrapped:
            continue  # a wrapper that is itself a linear: its base layer is the site
        found.append(LinearSite(_join(prefix, logical), module, _role(logical, name, modules, attention, blocks,
                                                                   order[name] < last_in_block),
                                _after_activation(logical, modules), left_alone(module, wrapper)))
    return found


def _after_activation(logical: str, modules: dict) -> bool:
    """Whether the linear at ``logical`` takes an activation's output: in a sequence, its nearest earlier member past
    dropouts is an activation (a parameter-free one, or one holding its own projection) rather than a linear."""
    parent_name, _, index = logical.rpartition(".")
    parent = modules.get(parent_name)
    if not isinstance(parent, (torch.nn.ModuleList, torch.nn.Sequential)) or not index.isdigit():
        return False
    for member in reversed(list(parent)[:int(index)]):
        if isinstance(member, _PASS_THROUGH):
            continue
        if isinstance(member, torch.nn.Linear) or isinstance(getattr(member, "base_layer", None), torch.nn.Linear):
            return False
        return isinstance(member, _ACTIVATIONS) or any(isinstance(m, torch.nn.Linear) for m in member.modules())
    return False


def _role(logical: str, name: str, modules: dict, attention: list[str], blocks: set[str], before: bool) -> str:
    owners = [a for a in attention if logical.startswith(a + ".")]
    if owners:
        owner = max(owners, key=len)
        return _attention_role(logical[len(owner) + 1:])
    if any(part.startswith("ff") for part in logical.split(".")[:-1]):
        return "feed-forward"
    parent = modules[logical.rpartition(".")[0]] if "." in logical else None
    if parent is not None and _is_modulation(parent):
        return "modulation"
    if any(logical.startswith(b + ".") for b in blocks):
        return "feed-forward"
    return "embedding" if before else "output"


# diffusers' fused projections (``fuse_qkv_projections``) and the projections each one computes in their place
FUSED_SOURCES = {"to_qkv": ("to_q", "to_k", "to_v"), "to_kv": ("to_k", "to_v"),
                 "to_added_qkv": ("add_q_proj", "add_k_proj", "add_v_proj"), "to_added_kv": ("add_k_proj", "add_v_proj")}


def fused_away(model: torch.nn.Module) -> dict[torch.nn.Module, str]:
    """The linears of ``model`` that a fused projection computes in their place while their attention module runs
    diffusers' fused projections (``fused_projections`` set, the fused linear present), each with the fused linear's
    name: a processor that uses the fused projections does not call them (LTX-Video's, HunyuanVideo's and
    CogVideoX's processors in diffusers 0.42 do not use them, so ask the calls before relying on this)."""
    away: dict[torch.nn.Module, str] = {}
    for attention in model.modules():
        if not getattr(attention, "fused_projections", False) or not callable(getattr(attention, "processor", None)):
            continue
        for fused, sources in FUSED_SOURCES.items():
            if isinstance(getattr(attention, fused, None), torch.nn.Module):
                for name in sources:
                    source = getattr(attention, name, None)
                    source = getattr(source, "base_layer", source)  # a PEFT wrapper's base layer is the site
                    if isinstance(source, torch.nn.Linear):
                        away[source] = fused
    return away

