"""Shared fixtures: the bundled pair, tiny random Llama checkpoints, a private Redis."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "assets" / "models" / "target"
DRAFT = ROOT / "assets" / "models" / "draft"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # engine tests that also run on a GPU, when one is here


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def save_random_llama(path: Path, **overrides) -> Path:
    """A randomly initialised HF LlamaForCausalLM with Llama-3.2 features, saved as safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
    )
    cfg.update(overrides)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(autouse=True)
def _collectable_engines():
    """An engine's warm-up freezes every object then alive out of the collector's sight (engine/engine.py), as a
    server wants; a test process builds hundreds of engines, so after each test its frozen objects, the engines
    among them, are handed back to the collector."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def random_llama_dir(tmp_path_factory) -> Path:
    return save_random_llama(tmp_path_factory.mktemp("random_llama"))


def make_runner(path: Path, kind: str, block_size: int = 8):
    """A float32 CPU ModelRunner on ``path`` with a small slotted or paged cache (room for a few requests)."""
    from engine.kv_cache import PagedKVCache, SlottedKVCache
    from engine.model_runner import ModelRunner
    from engine.models.loader import load_model

    cpu = torch.device("cpu")
    model, _ = load_model(path, torch.float32, cpu)
    shape = (model.args.num_layers, model.args.num_kv_heads, model.args.head_dim)
    if kind == "paged":
        cache = PagedKVCache(*shape, 768 // block_size, block_size, torch.float32, cpu)
    else:
        cache = SlottedKVCache(*shape, 4, 256, torch.float32, cpu)
    return ModelRunner(model, cache, cpu)
