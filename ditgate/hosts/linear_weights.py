"""Custody of one linear site's module: its routed forward, the weights a form keeps, and the host's weight.

While a site is served by a quantized form, the form's weights (8-bit values and per-channel scales) are buffers of
the site's module, so that they follow the module wherever ``module.to(...)`` sends it (``enable_model_cpu_offload``
moves the whole model each step), and the host's weight leaves the device: the original ``Parameter`` object keeps
its values in CPU memory (pinned where CUDA is available, so that the host path's copy back is asynchronous), or on
the device when the plan was asked to keep it there. In its place the module holds a ``HeldWeight``: a stand-in
with the host weight's shape, dtype and device and no storage, so that what reads ``module.weight`` for its
metadata (PEFT sizing and placing a LoRA adapter, ``ModelMixin.dtype``, a pipeline's device) reads what it read
before, and what would compute with it (PEFT fusing a LoRA into it, a cast to another dtype) stops with a sentence
that names the site instead of a wrong result.

``restore`` puts the original ``Parameter`` object back with its values, dtype and the device its module is on now,
removes the buffers and the routed forward: the module is as it was (``state_dict()`` equal, bit for bit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ..forms.linear import QuantizedWeight

logger = logging.getLogger("ditgate")

_aten = torch.ops.aten
PAYLOAD_DATA = "ditgate_qweight"
PAYLOAD_SCALE = "ditgate_wscale"
PAYLOAD_STATE = "ditgate_lstate"
KEEP_HOST = ("cpu", "device")
# The payload's floating-point tensors are held as buffers under integer views of the same bits: ``module.to(dtype)``
# (``pipe.to(torch.bfloat16)``) casts every floating buffer of a module, which would turn e4m3 weights and float32
# scales into bf16 values; integer buffers only move between devices.
_BITS = {torch.float8_e4m3fn: torch.uint8, torch.float32: torch.int32}


def _held_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.dtype]) if t.dtype in _BITS else t


class HeldWeightError(RuntimeError):
    """An operation that needs the values of a host weight that ditgate holds while a quantized form serves it."""


class HeldWeight(torch.Tensor):
    """A storage-less stand-in for a host weight in ditgate's custody: shape, dtype and device, no values."""

    site: str
    form: str

    held_as: str  # what the error says the weight is: "quantized (fp8_linear)", or why it is held without a form

    @staticmethod
    def __new__(cls, shape, dtype: torch.dtype | None = None, device: torch.device | None = None, site: str = "",
                form: str = "", requires_grad: bool = False, held_as: str = ""):
        if isinstance(shape, torch.Tensor):  # ``type(param)(values, requires_grad=...)``: accelerate's offloading
            raise HeldWeightError(
                "ditgate: a linear weight that an attached plan quantized cannot be rebuilt from other values (what "
                "accelerate's cpu_offload / enable_sequential_cpu_offload does to every weight); enable the offloading "
                "before attach (the plan then leaves those modules to the host), or detach the plan first")
        stand_in = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device,
                                                       requires_grad=requires_grad)
        stand_in.site, stand_in.form = site, form
        stand_in.held_as = held_as or f"quantized ({form})"
        return stand_in

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def __repr__(self, *, tensor_contents=None) -> str:
        return (f"HeldWeight(site={self.site!r}, form={self.form!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device={self.device})")

    def _like(self, device: torch.device | None = None) -> HeldWeight:
        """A stand-in like this one, as an operator's output: never requiring grad (a view of a leaf that does would
        be refused by autograd); ``Parameter`` carries the flag where the module holds it."""
        return HeldWeight(self.shape, self.dtype, device if device is not None else self.device, self.site, self.form,
                          False, self.held_as)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        me = args[0]
        if func in (_aten.detach.default, _aten.alias.default):
            return me._like()
        if func is _aten._to_copy.default:
            dtype = kwargs.get("dtype")
            if dtype is not None and dtype != me.dtype:
                raise HeldWeightError(
                    f"ditgate: {me.site}'s weight is {me.held_as} by an attached plan and cannot be cast to "
                    f"{dtype}; detach the plan (plan.detach()) before changing the model's dtype")
            return me._like(kwargs.get("device"))
        raise HeldWeightError(
            f"ditgate: {me.site}'s weight is {me.held_as} by an attached plan and has no values on the device "
            f"({func} needs them). What reads or writes a quantized site's weight values cannot run while the plan is "
            "attached (fuse_lora, a DoRA adapter, load_state_dict, a copy of the model): detach the plan "
            "(plan.detach()), do it, and attach again. A LoRA needs none of that: it runs at full precision beside the "
            "quantized weight")


def _to_cpu_memory(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in CPU memory, pinned where CUDA is available (pinning needs a CUDA context)."""
    pin = torch.cuda.is_available()
    held = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    held.copy_(t.detach())
    return held


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None or isinstance(t, HeldWeight) else t.numel() * t.element_size()


class WeightCustody:
    """Every change ditgate makes to one ``nn.Linear``, and the way back."""

    def __init__(self, site: str, module: torch.nn.Linear) -> None:
        self.site = site
        self.module = module
        self.original: torch.nn.Parameter = module._parameters["weight"]
        self._forward: Callable | None = None
        self.released_to: str | None = None  # "cpu" / "device" while the stand-in is in place
        self.payload_form: str | None = None
        self._payload_dtypes: dict[str, torch.dtype] = {}  # each payload buffer's own dtype (held as integer bits)
        self._state_dict_hook = None  # while held: the original's values in ``state_dict()`` in the stand-in's place

    @property
    def requires_grad(self) -> bool:
        """Whether the module's weight takes gradients now: the stand-in's flag while it is held (what PEFT and a
        user's ``requires_grad_`` set after attach), which ``bring_back_host`` hands back to the original."""
        return self.module._parameters["weight"].requires_grad

    # --- the routed forward --------------------------------------------------------------------------
    def install_forward(self, forward: Callable) -> None:
        self.module.forward = forward  # an instance attribute: this module alone, nothing process-wide
        self._forward = forward

    def remove_forward(self) -> None:
        if self._forward is None:
            return
        if self.module.__dict__.get("forward") is self._forward:
            del self.module.__dict__["forward"]
        else:
            logger.warning("ditgate: %s's forward was replaced after attach (by a hook?); leaving it in place",
                           self.site)
        self._forward = None

    # --- the form's weights --------------------------------------------------------------------------
    def hold_payload(self, form: str, weight: QuantizedWeight) -> None:
        """The form's weights as the module's buffers (non-persistent: ``state_dict()`` does not change), each under
        an integer view of its bits (``_BITS``); ``payload`` views them back. The state is the same memory the form
        updates in place."""
        self._drop_payload()
        for name, t in ((PAYLOAD_DATA, weight.data), (PAYLOAD_SCALE, weight.scale), (PAYLOAD_STATE, weight.state)):
            if t is not None:
                self.module.register_buffer(name, _held_bits(t), persistent=False)
                self._payload_dtypes[name] = t.dtype
        self.payload_form = form

    def payload(self) -> QuantizedWeight | None:
        buffers = self.module._buffers
        if buffers.get(PAYLOAD_DATA) is None:
            return None
        own = {name: buffers[name].view(dtype) for name, dtype in self._payload_dtypes.items()}
        return QuantizedWeight(own[PAYLOAD_DATA], own[PAYLOAD_SCALE], own.get(PAYLOAD_STATE))

    def payload_dtypes(self) -> tuple[torch.dtype, torch.dtype, torch.dtype | None] | None:
        """The payload's own dtypes (data, scale, state or None), as ``payload`` views its buffers; None without one."""
        if self.module._buffers.get(PAYLOAD_DATA) is None:
            return None
        own = self._payload_dtypes
        return own[PAYLOAD_DATA], own[PAYLOAD_SCALE], own.get(PAYLOAD_STATE)

    def _drop_payload(self) -> None:
        for name in (PAYLOAD_DATA, PAYLOAD_SCALE, PAYLOAD_STATE):
            self.module._buffers.pop(name, None)
        self._payload_dtypes.clear()
        self.payload_form = None

    # --- the host's weight ---------------------------------------------------------------------------
    def release_host(self, keep: str, held_as: str = "") -> None:
        """Put the stand-in in the host weight's place; its values go to CPU memory (``keep="cpu"``) or stay.
        ``held_as``: what an error about the stand-in calls the weight (default: quantized by the payload's form)."""
        if keep not in KEEP_HOST:
            raise ValueError(f"keep_host must be one of {KEEP_HOST}, not {keep!r}")
        if self.released_to is not None:
            return
        weight = self.original
        stand_in = HeldWeight(weight.shape, weight.dtype, weight.device, self.site, self.payload_form or "?",
                              weight.requires_grad, held_as)
        if keep == "cpu":
            weight.data = _to_cpu_memory(weight.data)
        self.module._parameters["weight"] = torch.nn.Parameter(stand_in, requires_grad=weight.requires_grad)
        self.released_to = keep
        self._state_dict_hook = self.module.register_state_dict_post_hook(  # a function: torch marks it
            lambda module, state_dict, prefix, meta: self._host_values_in_state_dict(state_dict, prefix))

    def _host_values_in_state_dict(self, state_dict: dict, prefix: str) -> None:
        """``state_dict()`` of a held site gives the host weight's values (where they wait: pinned CPU memory, or the
        device) in the stand-in's place, so that ``save_pretrained`` and ``torch.save`` of an attached model write
        the model as loaded, never the plan's stand-ins or its 8-bit weights (non-persistent buffers)."""
        key = prefix + "weight"
        entry = state_dict.get(key)
        if isinstance(entry, HeldWeight):
            if isinstance(entry, torch.nn.Parameter):  # ``keep_vars=True``: the Parameter itself, flag as set now
                self.original.requires_grad_(entry.requires_grad)
                state_dict[key] = self.original
            else:
                state_dict[key] = self.original.detach()

    def bring_back_host(self) -> None:
        """The host weight back on the module's device (a site that needs the host path at a live shape)."""
        if self.released_to is None:
            return
        stand_in = self.module._parameters.get("weight")
        device = stand_in.device if isinstance(stand_in, HeldWeight) else self.original.device
        if self.original.device != device or self.original.is_pinned():
            self.original.data = self.original.data.to(device, copy=True)
        if isinstance(stand_in, HeldWeight):
            self.original.requires_grad_(stand_in.requires_grad)  # as PEFT or the caller left it after attach
            self.module._parameters["weight"] = self.original
        else:
            logger.warning("ditgate: %s's weight was replaced after attach; leaving the new one in place", self.site)
        if self._state_dict_hook is not None:  # after the swap: a copy that failed leaves the hook serving values
            self._state_dict_hook.remove()
            self._state_dict_hook = None
        self.released_to = None

    def host_weight(self, device: torch.device) -> torch.Tensor:
        """The host's weight on ``device`` for one host-path call (copied there for the call where it is held)."""
        if self.released_to is None:
            return self.module.weight
        weight = self.original
        return weight if weight.device == device else weight.to(device, non_blocking=True)

    @property
    def device(self) -> torch.device:
        """Where the module's weight is now (the stand-in moves with the module)."""
        return self.module._parameters["weight"].device

    # --- accounting ----------------------------------------------------------------------------------
    def bytes_before(self) -> int:
        return tensor_bytes(self.original) + tensor_bytes(self.module.bias)

    def bytes_now(self) -> int:
        """Bytes this site holds on its module's device now: the form's weights, the bias, the host weight if there."""
        host = tensor_bytes(self.original) if self.original.device == self.device else 0
        payload = self.payload()
        return host + (payload.nbytes if payload is not None else 0) + tensor_bytes(self.module.bias)

    # --- the way back --------------------------------------------------------------------------------
    def restore(self) -> None:
        """The module exactly as before attach (on the device it is on now); a second call does nothing."""
        self.bring_back_host()
        self._drop_payload()
        self.remove_forward()


class LoraFuseRefusedError(HeldWeightError):
    """``fuse_lora`` on a model whose linear sites are served by quantized forms."""


def guard_fuse_lora(model: torch.nn.Module, quantized_sites: Callable[[], list[str]]) -> Callable[[], None]:
    """Refuse ``model.fuse_lora`` (diffusers' PEFT mixin; pipelines' ``fuse_lora`` calls it per component) before it
    changes anything while any site is quantized, with the reason; returns the way to take the guard off.

    Fusing would add the LoRA's delta into the host's weight, which is not on the device and not what the quantized
    weights were made from; the LoRA stays exact beside the quantized base instead. The guard is an attribute of this
    model instance alone."""
    fuse = getattr(model, "fuse_lora", None)
    if not callable(fuse):
        return lambda: None

    def fuse_lora(*args, **kwargs):
        sites = quantized_sites()
        if sites:
            raise LoraFuseRefusedError(
                f"ditgate: fuse_lora refused: {len(sites)} linear site(s) of this model are served by quantized forms "
                f"(first: {sites[0]}). Their LoRA runs at full precision beside the quantized weights, which is exact; "
                "to fuse, detach the plan (plan.detach()), fuse, and attach again (the fused weights are measured anew)")
        return fuse(*args, **kwargs)

    model.fuse_lora = fuse_lora

    def remove() -> None:
        if model.__dict__.get("fuse_lora") is fuse_lora:
            del model.__dict__["fuse_lora"]

    return remove
