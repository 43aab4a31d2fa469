"""Load Hugging Face Llama checkpoints (config.json + safetensors, sharded or not).

A checkpoint is a local directory or a hub repo id already present in the local hub
cache (nothing is ever downloaded). Errors name the file and what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import ModelLoadError
from engine.models.int8 import quantize_linears_int8
from engine.models.llama import LlamaArgs, LlamaModel, avoid_cudnn_attention, pack_linears_for_cpu, rope_inv_freq

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TARGET = REPO_ROOT / "assets" / "models" / "target"
DEFAULT_DRAFT = REPO_ROOT / "assets" / "models" / "draft"
LLAMA_ARCHITECTURES = {"LlamaForCausalLM"}


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A local directory, else a repo id looked up in the local HF hub cache only."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path), local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any hub failure means "not found locally"
        raise ModelLoadError(
            f"model {str(name_or_path)!r} is neither a local directory nor in the local Hugging Face hub cache "
            f"(downloads are disabled): {exc.__class__.__name__}"
        ) from None


def read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file}: missing (not a Hugging Face checkpoint directory)")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{config_file}: invalid JSON ({exc})") from None
    archs = set(config.get("architectures") or [])
    if config.get("model_type") != "llama" or not archs & LLAMA_ARCHITECTURES:
        raise ModelLoadError(
            f"{config_file}: model_type={config.get('model_type')!r}, architectures={sorted(archs)}; "
            "only Llama-architecture checkpoints (LlamaForCausalLM) are supported"
        )
    return config


def llama_args(config: dict) -> LlamaArgs:
    heads = config["num_attention_heads"]
    # transformers 5.x writes rope settings under rope_parameters; 4.x under rope_theta/rope_scaling
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    return LlamaArgs(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=config.get("rope_theta", rope.get("rope_theta", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
        attention_bias=config.get("attention_bias", False),
        mlp_bias=config.get("mlp_bias", False),
    )


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ModelLoadError(f"{index}: lists shards that are missing: {', '.join(missing)}")
        return [path / s for s in shards]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    raise ModelLoadError(f"{path}: no model.safetensors or model.safetensors.index.json")


def read_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                tensors[key.removeprefix("model.")] = f.get_tensor(key)
    return tensors


def fuse_projections(sd: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """HF stores q/k/v and gate/up separately; we run each group as one matmul."""
    for i in range(num_layers):
        pre = f"layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [sd.pop(f"{pre}self_attn.{p}_proj.{kind}", None) for p in "qkv"]
            if all(t is not None for t in qkv):
                sd[f"{pre}self_attn.qkv_proj.{kind}"] = torch.cat(qkv)
            gate_up = [sd.pop(f"{pre}mlp.{p}_proj.{kind}", None) for p in ("gate", "up")]
            if all(t is not None for t in gate_up):
                sd[f"{pre}mlp.gate_up_proj.{kind}"] = torch.cat(gate_up)
    return sd


def load_model(name_or_path: str | Path, dtype: torch.dtype, device: torch.device,
               int8: bool = False) -> tuple[LlamaModel, Path]:
    """The checkpoint's model on ``device``; on a CPU its linears packed for oneDNN, or with ``int8`` (a draft
    model, whose numerics never reach the output: engine/models/int8.py) run as int8 where this torch can."""
    path = resolve_checkpoint(name_or_path)
    config = read_config(path)
    args = llama_args(config)
    state = fuse_projections(read_state_dict(weight_files(path)), args.num_layers)
    if args.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LlamaModel(args)
    expected = {k for k in model.state_dict() if not (args.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - state.keys(), state.keys() - expected
    unexpected = {k for k in unexpected if "rotary_emb" not in k}
    if missing or unexpected:
        raise ModelLoadError(
            f"{path}: weights do not match the Llama config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    model = model.to_empty(device=device)
    weights = {k: v.to(dtype) for k, v in state.items() if k in expected}
    if args.tie_word_embeddings:  # the module still lists the tied lm_head.weight: give it the embedding
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    model.load_state_dict(weights)
    if args.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model = model.to(dtype).eval()
    if torch.device(device).type == "cpu":
        if not (int8 and quantize_linears_int8(model)):
            pack_linears_for_cpu(model)
    else:
        avoid_cudnn_attention()
    model.inv_freq = rope_inv_freq(args).to(device)  # float32 always; was a meta buffer
    return model, path
