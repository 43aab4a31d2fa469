"""Int8 linears for the draft model on a CPU.

A draft model's numerics never reach the output: the target verifies every drafted token, and rejection sampling
reads the draft's distribution only as the one its tokens were drawn from. So the draft may run on cheaper
arithmetic, and only its acceptance (how often the target agrees) can change. Its k passes a round run a few rows
each through small weights, where a CPU streams the weights and pays per call: on a Zen 3 VM (one thread) the
bundled draft's pass took 1.6 ms with int8 linears against 2.0 ms with oneDNN's packed float32 ones at 1 request,
4.3 against 6.0 ms at 32, and in lockstep speculation ran 1.02-1.11x faster at the same acceptance (fixed draft
k = 4 1.10x at 1 code client, T = 1; k = 2 1.05x at 32 prose clients, T = 0.7, from 1.03x to 1.09x ``off``;
bench/draft_int8.py). No kernel is built per row count: a new count's first call costs about what a repeat does.

Weights are quantized per output channel (symmetric, max-abs); activations are quantized per call by fbgemm's
dynamic linear (``torch.ops.quantized.linear_dynamic``), with the reduced range that keeps its AVX2 kernels from
saturating. That op works on quantized tensors, which torch marks as deprecated; where it is missing or disagrees
with a float linear on a probe, the model keeps its float linears.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from engine.models.llama import replace_linears

PROBE_TOLERANCE = 0.05  # of the probe's largest output: int8 rounding stays well within this


class Int8Linear(nn.Module):
    """A ``Linear`` run by fbgemm's dynamic int8 kernel: int8 weights (per output channel), float in and out."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0).double()
        bias = None if linear.bias is None else linear.bias.detach().float()
        with warnings.catch_warnings():  # the quantized-tensor deprecation notice, once per weight
            warnings.simplefilter("ignore", UserWarning)
            quantized = torch.quantize_per_channel(weight, scales, torch.zeros(len(scales), dtype=torch.long), 0,
                                                   torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(quantized, bias)  # opaque: not a parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return torch.ops.quantized.linear_dynamic(x, self.packed, True)
        return torch.ops.quantized.linear_dynamic(x.float(), self.packed, True).to(x.dtype)


def int8_linears(model: nn.Module) -> list[Int8Linear]:
    """``model``'s int8 linears, in the order its forward pass meets them."""
    return [module for module in model.modules() if isinstance(module, Int8Linear)]


def quantize_linears_int8(model: nn.Module) -> bool:
    """Swap every ``nn.Linear`` of a CPU model for an :class:`Int8Linear`; False (and no change) where this torch
    build lacks the dynamic int8 linear or it disagrees with ``F.linear`` on a probe."""
    try:
        probe = nn.Linear(64, 32)
        x = torch.randn(3, 64)
        with torch.inference_mode():
            expected, got = probe(x), Int8Linear(probe)(x)
        ok = bool((got - expected).abs().max() <= PROBE_TOLERANCE * expected.abs().max())
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    if not ok:
        return False
    replace_linears(model, Int8Linear)
    return True
