"""Checkpoint loading: every bad checkpoint is a ModelLoadError naming the file; sharded checkpoints load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.errors import ModelLoadError
from engine.kv_cache import PagedKVCache
from engine.model_runner import ModelRunner, SeqChunk
from engine.models.loader import load_model
from engine.models.tokenizer import check_compatible, load_tokenizer
from tests.conftest import TARGET, save_random_llama

CPU = torch.device("cpu")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load(path) -> None:
    load_model(path, torch.float32, CPU)


def copy_config(src: Path, dst: Path, **changes) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def sharded_dir(random_llama_dir, tmp_path_factory) -> Path:
    """The session's random Llama re-saved by transformers in ~100 KB shards."""
    from transformers import LlamaForCausalLM

    path = tmp_path_factory.mktemp("sharded")
    LlamaForCausalLM.from_pretrained(random_llama_dir).save_pretrained(path, max_shard_size="100KB")
    return path


# ---------------------------------------------------------------- bad checkpoints


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="neither a local directory"):
        load(tmp_path / "does-not-exist")


def test_missing_config(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        load(tmp_path)
    assert str(tmp_path / "config.json") in info.value.message and "missing" in info.value.message


def test_invalid_json_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json: invalid JSON"):
        load(tmp_path)


def test_non_llama_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError) as info:
        load(tmp_path)
    message = info.value.message
    assert str(tmp_path / "config.json") in message and "gpt2" in message and "Llama" in message


def test_llama_type_with_another_architecture(random_llama_dir, tmp_path):
    copy_config(random_llama_dir, tmp_path, architectures=["LlamaForSequenceClassification"])
    with pytest.raises(ModelLoadError, match="LlamaForSequenceClassification"):
        load(tmp_path)


def test_missing_safetensors(random_llama_dir, tmp_path):
    copy_config(random_llama_dir, tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load(tmp_path)
    assert "model.safetensors" in info.value.message and str(tmp_path) in info.value.message


def test_index_listing_a_missing_shard(sharded_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(sharded_dir, broken)
    shards = sorted(broken.glob("model-*.safetensors"))
    shards[1].unlink()
    with pytest.raises(ModelLoadError) as info:
        load(broken)
    assert shards[1].name in info.value.message and "model.safetensors.index.json" in info.value.message
    assert shards[0].name not in info.value.message


def test_weights_that_do_not_match_the_config(random_llama_dir, tmp_path):
    copy_config(random_llama_dir, tmp_path, num_hidden_layers=3)
    shutil.copy(random_llama_dir / "model.safetensors", tmp_path)
    with pytest.raises(ModelLoadError, match=r"weights do not match the Llama config: missing \['layers\.2\."):
        load(tmp_path)


def test_missing_tokenizer(random_llama_dir):
    with pytest.raises(ModelLoadError, match="no tokenizer.json or tokenizer.model"):
        load_tokenizer(random_llama_dir)


# ---------------------------------------------------------------- draft / target compatibility


@pytest.fixture(scope="module")
def target_tok():
    return load_tokenizer(TARGET)


def test_compatible_pair_passes(target_tok):
    check_compatible(target_tok, load_tokenizer(TARGET), Path("t"), Path("d"), 4096, 4096)


def test_vocab_size_mismatch(target_tok):
    with pytest.raises(ModelLoadError) as info:
        check_compatible(target_tok, target_tok, Path("/m/target"), Path("/m/draft"), 4096, 512)
    message = info.value.message
    assert "/m/draft" in message and "/m/target" in message and "vocab_size 4096 (target) != 512 (draft)" in message


def test_tokenizer_size_mismatch(target_tok):
    other = load_tokenizer(TARGET)
    other.add_tokens(["<an-extra-token>"])
    with pytest.raises(ModelLoadError, match=r"tokenizer size 4096 \(target\) != 4097 \(draft\)"):
        check_compatible(target_tok, other, Path("t"), Path("d"), 4096, 4096)


def test_special_token_mismatch(target_tok):
    other = load_tokenizer(TARGET)
    other.eos_token = other.convert_ids_to_tokens(1) if other.eos_token_id != 1 else other.convert_ids_to_tokens(3)
    with pytest.raises(ModelLoadError, match="eos_token_id"):
        check_compatible(target_tok, other, Path("t"), Path("d"), 4096, 4096)


def test_same_size_but_different_ids(target_tok, tmp_path):
    for name in TOKENIZER_FILES:
        shutil.copy(TARGET / name, tmp_path)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "def", "return"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelLoadError, match="vocabularies map tokens to different ids"):
        check_compatible(target_tok, load_tokenizer(tmp_path), Path("t"), Path("d"), 4096, 4096)


def test_engine_rejects_an_incompatible_draft(tmp_path):
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    draft = save_random_llama(tmp_path / "draft", vocab_size=512)
    for name in TOKENIZER_FILES:
        shutil.copy(TARGET / name, draft)
    config = EngineConfig(model=str(TARGET), draft_model=str(draft), device="cpu", dtype="float32",
                          max_seq_len=64, max_running=1)
    with pytest.raises(ModelLoadError) as info:
        LLMEngine(config)
    assert str(draft) in info.value.message and "vocab_size 4096 (target) != 512 (draft)" in info.value.message


# ---------------------------------------------------------------- sharded checkpoints load


def logits_of(model, ids: list[int]) -> torch.Tensor:
    a = model.args
    runner = ModelRunner(model, PagedKVCache(a.num_layers, a.num_kv_heads, a.head_dim, 16, 8, torch.float32, CPU),
                         CPU)
    runner.cache.allocate("r")
    runner.cache.reserve("r", len(ids))
    with torch.no_grad():
        return runner.execute([SeqChunk("r", ids, 0, len(ids))])[0]


def test_sharded_checkpoint_loads_like_the_unsharded_one(random_llama_dir, sharded_dir):
    assert len(list(sharded_dir.glob("model-*.safetensors"))) > 1 and not (sharded_dir / "model.safetensors").exists()
    sharded, _ = load_model(sharded_dir, torch.float32, CPU)
    single, _ = load_model(random_llama_dir, torch.float32, CPU)
    a, b = sharded.state_dict(), single.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, 512, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    assert torch.equal(logits_of(sharded, ids), logits_of(single, ids))
