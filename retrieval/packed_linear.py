"""bf16 linear layers whose weights are reordered once for oneDNN: the CPU query encoder's forward passes.

A plain bf16 ``nn.Linear`` on CPU hands oneDNN its weight in PyTorch's layout, and oneDNN reorders it into its
blocked layout on every call; for the small passes of a query call (tens to a few hundred tokens) that reorder costs
as much as the product (docs/results/engines/session48: 1.7x at 22 rows, 1.15x at 143, 1.08x at 320, outputs equal
to the bit). :func:`packed_copy` (``PackedLinear`` layers) does once what ``torch.compile``'s freezing does for CPU
linears (``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``), without compiling anything.
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


def __getattr__(name: str) -> Any:
    if name == "PackedLinear":
        return packed_linear_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def packed_copy(model: Any) -> Any | None:
    """A copy of ``model`` (a torch module) for inference whose bf16 ``nn.Linear`` layers are ``PackedLinear``; None
    when it has none, or this torch build cannot pack them (no oneDNN, or the op is missing)."""
    import torch

    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return None
    packed_linear = packed_linear_class()
    clone = copy.deepcopy(model)
    swapped = 0
    try:
        for module in list(clone.modules()):
            for name, child in list(module.named_children()):
                weight = getattr(child, "weight", None)
                if type(child) is torch.nn.Linear and weight.dtype == torch.bfloat16 and weight.device.type == "cpu":
                    setattr(module, name, packed_linear(child))
                    swapped += 1
    except RuntimeError as exc:  # an unsupported CPU or build: keep the plain layers
        log.warning("cannot pack the query encoder's linear layers (%s); using plain ones", exc)
        return None
    return clone if swapped else None
