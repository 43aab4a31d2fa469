"""Int8 linears for the draft model (engine/models/int8.py) and the setting that chooses them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.config import EngineConfig
from engine.models import int8
from engine.models.int8 import Int8Linear, int8_linears, quantize_linears_int8
from engine.models.loader import load_model
from tests.conftest import DRAFT


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_close_to_the_float_linear(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(192, 576, bias=bias)
    x = torch.randn(5, 192)
    with torch.inference_mode():
        expected, got = linear(x), Int8Linear(linear)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert (got - expected).abs().max() <= 0.03 * expected.abs().max()


def test_int8_linear_keeps_the_input_dtype() -> None:
    linear = Int8Linear(nn.Linear(16, 8))
    with torch.inference_mode():
        assert linear(torch.randn(2, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_the_bundled_draft_loads_with_int8_linears_and_predicts_as_before() -> None:
    plain, _ = load_model(DRAFT, torch.float32, torch.device("cpu"))
    quantized, _ = load_model(DRAFT, torch.float32, torch.device("cpu"), int8=True)
    assert not int8_linears(plain)
    assert len(int8_linears(quantized)) == 4 * quantized.args.num_layers + 1  # qkv, o, gate_up, down; lm_head
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    x = torch.randn(64, quantized.args.hidden_size)
    with torch.inference_mode():  # the tied lm_head keeps the embedding's float weights for lookups
        expected = x @ plain.embed_tokens.weight.t()
        got = quantized.lm_head(x)
    agree = (got.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree >= 0.9 and torch.equal(quantized.embed_tokens.weight, plain.embed_tokens.weight)


def test_a_torch_without_the_int8_kernel_keeps_float_linears(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(self, linear):
        raise RuntimeError("no fbgemm in this build")

    monkeypatch.setattr(int8.Int8Linear, "__init__", missing)
    model = nn.Sequential(nn.Linear(8, 8))
    assert not quantize_linears_int8(model)
    assert isinstance(model[0], nn.Linear)
    quantized, _ = load_model(DRAFT, torch.float32, torch.device("cpu"), int8=True)  # falls back to packed floats
    assert not int8_linears(quantized)


def test_draft_quantization_setting() -> None:
    assert EngineConfig(device="cpu").draft_int8
    assert EngineConfig(device="cpu", draft_quantization="int8").draft_int8
    assert not EngineConfig(device="cpu", draft_quantization="none").draft_int8
    with pytest.raises(ValueError, match="draft_quantization must be one of auto, none, int8"):
        EngineConfig(device="cpu", draft_quantization="int4")
    with pytest.raises(ValueError, match="int8 runs on a CPU only"):
        EngineConfig(device="cuda", draft_quantization="int8")
    assert not EngineConfig(device="cuda").draft_int8  # auto: float on a GPU


def test_the_benchs_float_twin_drafts_with_the_float_model_while_its_flag_is_set() -> None:
    from types import SimpleNamespace

    from bench.draft_int8 import draft_in_float

    runner = SimpleNamespace(model="int8 draft")
    seen: list[str] = []
    engine = SimpleNamespace(proposers={"draft": SimpleNamespace(runner=runner)},
                             step=lambda: seen.append(runner.model))
    draft_in_float(engine, "float draft")
    engine.step()
    engine.float_draft = False  # its policy moved on to another engine
    engine.step()
    assert seen == ["float draft", "int8 draft"]
