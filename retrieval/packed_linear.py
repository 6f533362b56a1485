"""bf16 linear layers whose weights are reordered once for oneDNN: the CPU query encoder's forward passes.

A plain bf16 ``nn.Linear`` on CPU hands oneDNN its weight in PyTorch's layout, and oneDNN reorders it into its
blocked layout on every call; for the small passes of a query call (tens to a few hundred tokens) that reorder costs
as much as the product (docs/results/engines/session48: 1.7x at 22 rows, 1.15x at 143, 1.08x at 320, outputs equal
to the bit). :func:`packed_copy` (:func:`packed_linear_class` layers) does once what ``torch.compile``'s freezing does
for CPU linears (``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``), without compiling anything.
"""

from __future__ import annotations

import copy
import logging
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def packed_linear_class() -> type:
    """The ``PackedLinear`` module class (defined on first use: importing this module does not import torch)."""
    import torch

    class PackedLinear(torch.nn.Module):
        """``nn.Linear`` for inference with its bf16 weight kept in oneDNN's blocked layout (any leading shape)."""

        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
            self.bias = None if linear.bias is None else linear.bias.detach()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """``x @ weight.T + bias``, the same numbers as the ``nn.Linear`` it replaces."""
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    return PackedLinear


@lru_cache(maxsize=1)
def packing_supported() -> bool:
    """Whether this torch build and CPU run a packed bf16 linear, with the plain one's numbers (oneDNN's bf16 path
    needs AVX-512 or AMX; an AVX2-only CPU answers False)."""
    import torch

    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    try:
        with torch.inference_mode():
            linear = torch.nn.Linear(16, 8).to(torch.bfloat16)
            x = torch.ones(3, 16, dtype=torch.bfloat16)
            return bool(torch.equal(packed_linear_class()(linear)(x), linear(x)))
    except RuntimeError as exc:
        log.info("packed bf16 linears unavailable here (%s)", exc)
        return False


def packed_copy(model: Any) -> Any | None:
    """A copy of ``model`` (a torch module) for inference whose bf16 ``nn.Linear`` layers are ``PackedLinear``; None
    when it has none, or this torch build or CPU cannot pack them (:func:`packing_supported`)."""
    import torch

    def packable(child: Any) -> bool:
        weight = getattr(child, "weight", None)
        return type(child) is torch.nn.Linear and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"

    if not any(packable(m) for m in model.modules()) or not packing_supported():
        return None
    packed_linear = packed_linear_class()
    clone = copy.deepcopy(model)
    swapped = 0
    try:
        for module in list(clone.modules()):
            for name, child in list(module.named_children()):
                if packable(child):
                    setattr(module, name, packed_linear(child))
                    swapped += 1
    except RuntimeError as exc:  # an unsupported CPU or build: keep the plain layers
        log.warning("cannot pack the query encoder's linear layers (%s); using plain ones", exc)
        return None
    return clone if swapped else None
