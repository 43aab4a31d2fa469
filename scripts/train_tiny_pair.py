"""Train the bundled draft/target pair on the CPython standard library.

Stages (run all by default, or one with ``--stage``):

1. ``tokenizer``: byte-level BPE (vocab 4096) with Llama-3-style special tokens
   and a chat template, trained on the stdlib ``.py`` files (held-out files excluded).
2. ``target``: a LlamaForCausalLM (6 x 384, GQA, tied embeddings) trained from scratch.
3. ``draft``: a 2 x 192 LlamaForCausalLM pre-trained on the corpus, then distilled
   on the target's logits (KL), which is what raises acceptance.
4. ``distill`` (not part of ``all``): distil the bundled draft further on the bundled
   target, leaving the target and the tokenizer as they are.

The corpus mixes raw source files with chat-formatted examples (docstring as the
user turn, the function as the assistant turn, closed by ``<|eot_id|>``) so that
chat completions on the bundled pair stop properly.

Everything is seeded; weights reproduce bit for bit only with the same Python
minor version, torch build, CPU and thread count, which is why the results are
committed (bf16, with a sha256 manifest) rather than regenerated.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "models"
WORK = ROOT / ".train_work"
SEED = 1234
VOCAB_SIZE = 4096
SEQ_LEN = 512
SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|pad|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "dist-packages"}

TARGET_SHAPE = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                    num_attention_heads=6, num_key_value_heads=2)
DRAFT_SHAPE = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=3, num_key_value_heads=1)


# ----------------------------------------------------------------------------- corpus

def corpus_files() -> tuple[list[Path], list[Path]]:
    """Stdlib ``.py`` files split into (train, held_out) by md5 of the relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts):
            continue
        digest = int(hashlib.md5(str(rel).encode()).hexdigest(), 16)
        (held if digest % 20 == 0 else train).append(path)
    return train, held


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def chat_examples(source: str) -> list[tuple[str, str]]:
    """(docstring, function source) pairs from one module, for chat-format training."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    pairs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node)
            body = ast.get_source_segment(source, node)
            if doc and body and 40 <= len(body) <= 2500:
                pairs.append((doc.strip().split("\n\n")[0], body))
    return pairs


# ----------------------------------------------------------------------------- tokenizer

def train_tokenizer(train_files: list[Path], out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator((read(p) for p in train_files), trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        pad_token="<|pad|>", additional_special_tokens=SPECIALS[1:2] + SPECIALS[3:],
        model_max_length=2048, clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tokenizer(fast, out_dir)
    return load_tokenizer(out_dir)


def save_tokenizer(tok, out_dir: Path) -> None:
    """Save, then rewrite the config that transformers 5.x writes into one 4.x can read too."""
    tok.save_pretrained(out_dir)
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    for stray in ("is_local", "local_files_only", "backend"):
        cfg.pop(stray, None)
    extra = cfg.pop("extra_special_tokens", None)
    if extra and "additional_special_tokens" not in cfg:
        cfg["additional_special_tokens"] = list(extra)
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


def token_stream(files: list[Path], tok, with_chat: bool, seed: int) -> torch.Tensor:
    """One long int32 stream: each file as bos+text+eot, interleaved with chat examples."""
    rng = random.Random(seed)
    docs: list[list[int]] = []
    bos, eot = tok.bos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")
    for path in files:
        text = read(path)
        docs.append([bos] + tok.encode(text, add_special_tokens=False) + [eot])
        if with_chat:
            for doc, body in chat_examples(text):
                msgs = [{"role": "user", "content": doc}, {"role": "assistant", "content": body}]
                rendered = tok.apply_chat_template(msgs, tokenize=False)
                docs.append(tok.encode(rendered, add_special_tokens=False))
    rng.shuffle(docs)
    return torch.tensor([t for d in docs for t in d], dtype=torch.int32)


def batches(stream: torch.Tensor, batch: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    n = stream.numel() - SEQ_LEN - 1
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen)
        yield torch.stack([stream[s: s + SEQ_LEN + 1].long() for s in starts.tolist()])


# ----------------------------------------------------------------------------- models

def make_model(shape: dict, tok):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(
        vocab_size=len(tok), max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.convert_tokens_to_ids("<|eot_id|>"), tok.convert_tokens_to_ids("<|end_of_text|>")],
        pad_token_id=tok.pad_token_id, hidden_act="silu", **shape,
    )
    return LlamaForCausalLM(cfg)


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def held_out_ce(model, stream: torch.Tensor, windows: int = 48) -> float:
    model.eval()
    losses = []
    for i in range(windows):
        s = (i * (stream.numel() - SEQ_LEN - 1)) // windows
        x = stream[s: s + SEQ_LEN + 1].long()[None]
        logits = model(x[:, :-1]).logits.float()
        losses.append(F.cross_entropy(logits[0], x[0, 1:]).item())
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def top1_agreement(draft, target, stream: torch.Tensor, windows: int = 24) -> float:
    agree = total = 0
    for i in range(windows):
        s = (i * (stream.numel() - SEQ_LEN - 1)) // windows
        x = stream[s: s + SEQ_LEN].long()[None]
        a = draft(x).logits.argmax(-1)
        b = target(x).logits.argmax(-1)
        agree += (a == b).sum().item()
        total += a.numel()
    return agree / total


def train(model, stream, held, steps: int, batch: int, peak_lr: float, log: str,
          teacher=None, ckpt_dir: Path | None = None) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    data = batches(stream, batch, SEED + steps)
    start = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        x = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x[:, :-1]).logits.float()
            if teacher is None:
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
            else:
                with torch.no_grad():
                    t_logp = F.log_softmax(teacher(x[:, :-1]).logits.float(), -1)
                loss = F.kl_div(F.log_softmax(logits, -1), t_logp, log_target=True, reduction="batchmean") / SEQ_LEN
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            rate = (step + 1) * batch * SEQ_LEN / (time.time() - start)
            print(f"[{log}] step {step}/{steps} loss {loss.item():.3f} {rate:.0f} tok/s", flush=True)
        if ckpt_dir is not None and (step + 1) % 300 == 0:
            save(model, ckpt_dir)
            print(f"[{log}] held-out CE {held_out_ce(model, held):.3f}", flush=True)
    return {"steps": steps, "tokens": steps * batch * SEQ_LEN, "seconds": round(time.time() - start, 1)}


def save(model, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    model.to(torch.float32)


def write_manifest(out_dir: Path) -> None:
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out_dir.iterdir()) if p.is_file() and p.name != "SHA256SUMS"}
    (out_dir / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sums.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", choices=["tokenizer", "target", "draft", "distill", "all"], default="all")
    ap.add_argument("--target-steps", type=int, default=3000)
    ap.add_argument("--draft-steps", type=int, default=900)
    ap.add_argument("--distill-steps", type=int, default=600)
    ap.add_argument("--distill-lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)
    train_files, held_files = corpus_files()
    print(f"corpus: {len(train_files)} train files, {len(held_files)} held-out", flush=True)
    if args.stage == "distill":
        distill_bundled(args, train_files, held_files)
        return
    tok_dir = WORK / "tokenizer"
    if args.stage in ("tokenizer", "all") or not tok_dir.exists():
        tok = train_tokenizer(train_files, tok_dir)
    else:
        tok = load_tokenizer(tok_dir)
    stream = token_stream(train_files, tok, with_chat=True, seed=SEED)
    held = token_stream(held_files, tok, with_chat=False, seed=SEED)
    print(f"tokens: train {stream.numel()}, held-out {held.numel()}", flush=True)
    report_path = WORK / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report["corpus"] = {"train_files": len(train_files), "held_out_files": len(held_files),
                        "train_tokens": stream.numel(), "held_out_tokens": held.numel(),
                        "python": sys.version.split()[0], "torch": torch.__version__}

    if args.stage in ("target", "all"):
        torch.manual_seed(SEED)
        target = make_model(TARGET_SHAPE, tok)
        stats = train(target, stream, held, args.target_steps, 8, 1e-3, "target", ckpt_dir=WORK / "target")
        stats["held_out_ce"] = held_out_ce(target, held)
        stats["params"] = sum(p.numel() for p in target.parameters())
        report["target"] = stats
        save(target, WORK / "target")
        save_tokenizer(tok, WORK / "target")
    if args.stage in ("draft", "all"):
        from transformers import LlamaForCausalLM
        target = LlamaForCausalLM.from_pretrained(WORK / "target", dtype=torch.float32).eval()
        torch.manual_seed(SEED + 1)
        draft = make_model(DRAFT_SHAPE, tok)
        pre = train(draft, stream, held, args.draft_steps, 16, 2e-3, "draft")
        pre["held_out_ce"] = held_out_ce(draft, held)
        pre["top1_agreement"] = top1_agreement(draft, target, held)
        dist = train(draft, stream, held, args.distill_steps, 8, 1e-3, "distill", teacher=target)
        report["draft"] = {
            "params": sum(p.numel() for p in draft.parameters()), "pretrain": pre, "distill": dist,
            "held_out_ce": held_out_ce(draft, held), "top1_agreement": top1_agreement(draft, target, held),
        }
        for name, model in (("target", target), ("draft", draft)):
            save(model, OUT / name)
            save_tokenizer(tok, OUT / name)
            write_manifest(OUT / name)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def distill_bundled(args, train_files: list[Path], held_files: list[Path]) -> None:
    """More KL distillation of the committed draft on the committed target; rewrites the draft and the report."""
    from transformers import LlamaForCausalLM

    tok = load_tokenizer(OUT / "target")
    stream = token_stream(train_files, tok, with_chat=True, seed=SEED)
    held = token_stream(held_files, tok, with_chat=False, seed=SEED)
    target = LlamaForCausalLM.from_pretrained(OUT / "target", dtype=torch.float32).eval()
    draft = LlamaForCausalLM.from_pretrained(OUT / "draft", dtype=torch.float32)
    before = top1_agreement(draft, target, held)
    torch.manual_seed(SEED + 2)
    stats = train(draft, stream, held, args.distill_steps, 8, args.distill_lr, "distill+", teacher=target,
                  ckpt_dir=WORK / "draft_distill")
    stats.update(peak_lr=args.distill_lr, top1_agreement_before=before,
                 top1_agreement=top1_agreement(draft, target, held), held_out_ce=held_out_ce(draft, held))
    report_path = OUT / "training_report.json"
    report = json.loads(report_path.read_text())
    report["draft"].setdefault("further_distill", []).append(stats)
    report["draft"]["held_out_ce"], report["draft"]["top1_agreement"] = stats["held_out_ce"], stats["top1_agreement"]
    save(draft, OUT / "draft")
    save_tokenizer(tok, OUT / "draft")
    write_manifest(OUT / "draft")
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
