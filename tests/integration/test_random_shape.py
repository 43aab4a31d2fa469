"""bench/random_model.py: a random checkpoint of a real shape loads in our engine and in transformers alike
(shrunk here so it runs on CPU; bench/decode.py --shape uses the full sizes on a GPU)."""

from __future__ import annotations

import torch

from bench.decode import add_roofline
from bench.random_model import random_prompts, write_random_checkpoint
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.types import SamplingParams

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 600, "bos_token_id": 598, "eos_token_id": 599,
        "max_position_embeddings": 512}


def test_random_shape_runs_in_our_engine_and_matches_transformers(tmp_path) -> None:
    from transformers import LlamaForCausalLM

    path = write_random_checkpoint(tmp_path / "ckpt", "llama-3.2-3b", torch.float32, **TINY)
    engine = LLMEngine(EngineConfig(model=str(path), draft_model=None, speculation="off", max_seq_len=128,
                                    max_running=2))
    [prompt] = random_prompts(1, 12, engine.model.args.vocab_size)
    engine.add_request("r", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    ids, text = [], ""
    while engine.has_work():
        for out in engine.step():
            ids += out.new_token_ids
            text += out.new_text
    assert len(ids) == 6 and text.strip()  # ids decode through the word-level tokenizer
    hf = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 12:]
    assert ids == expected.tolist()

    rows = [{"concurrency": 2, "ours_tok_s": 100.0}]
    assert add_roofline(rows, engine, 1.0) == ["weight_gb_per_s", "roofline_fraction"]
    weight_bytes = sum(p.numel() * 4 for p in engine.model.parameters())
    assert rows[0]["weight_gb_per_s"] == rows[0]["roofline_fraction"] == weight_bytes / 0.02 / 1e9
