"""Randomly initialised checkpoints of real model shapes (no model hub needed).

The weights are noise, but the compute and the memory traffic of a decode step are the real model's,
which is all a throughput or HBM-roofline measurement needs. The checkpoint is written in Hugging Face
format (config.json, model.safetensors) with a word-level tokenizer of the full vocabulary, so our
engine and transformers load the very same files.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
COMMON = {"vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
          "max_position_embeddings": 131072, "tie_word_embeddings": True, "bos_token_id": 128000,
          "eos_token_id": 128001}
SHAPES = {  # the published configs' sizes
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64},
    "llama-3.2-3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128},
}


def write_random_checkpoint(path: Path, shape: str, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                            seed: int = 0, **overrides) -> Path:
    """Write ``shape`` (a SHAPES key) with random weights to ``path``; ``overrides`` change config values."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    config = LlamaConfig(**{**COMMON, **SHAPES[shape], **overrides})
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    write_word_tokenizer(path, config.vocab_size, config.bos_token_id, config.eos_token_id)
    return path


def write_word_tokenizer(path: Path, vocab_size: int, bos_id: int, eos_id: int) -> None:
    """A tokenizer whose every id is one word ``<tN>``: ids decode to text, no training needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<t{i}>": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=f"<t{bos_id}>", eos_token=f"<t{eos_id}>",
                                   unk_token="<t0>")
    fast.save_pretrained(path)


def random_prompts(n: int, length: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts drawn from the ordinary ids (below the special tokens of Llama 3)."""
    rng = random.Random(seed)
    top = min(vocab_size, COMMON["bos_token_id"])
    return [[rng.randrange(1, top) for _ in range(length)] for _ in range(n)]
