"""Engine subcommands of the ``specserve`` CLI: ``generate`` and ``policy show|set``.

``generate`` writes only the generated text to stdout (streaming); progress and logs go
to stderr. ``policy`` reads and edits the local policy file that ``generate`` starts from
(``--policy-file``, default ``~/.config/specserve/policy.json``), or, with ``--url``, a
running server's ``/admin/policy`` (a server's policy lives in the server, and in Redis
when replicas share one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

from engine.config import DRAFT_QUANTIZATION, DTYPES, SPECULATION, EngineConfig
from engine.errors import EngineError
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.types import SamplingParams

DEFAULT_POLICY_FILE = Path(os.path.expanduser("~/.config/specserve/policy.json"))


def add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=str(DEFAULT_TARGET), help="target checkpoint dir or hub id (local cache)")
    p.add_argument("--draft-model", default=str(DEFAULT_DRAFT), help="draft checkpoint, or 'none'")
    p.add_argument("--draft-quantization", default="auto", choices=DRAFT_QUANTIZATION,
                   help="the draft model's linears: auto (int8 on a CPU), none or int8 (its numerics never reach "
                        "the output, only its acceptance)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    p.add_argument("--speculation", default=None, choices=SPECULATION,
                   help="default: the policy file's mode, else auto")
    p.add_argument("--k", type=int, default=4, help="draft length of the fixed modes")
    p.add_argument("--k-max", type=int, default=8)
    p.add_argument("--policy-file", type=Path, default=DEFAULT_POLICY_FILE)


def add_engine_commands(subparsers) -> None:
    gen = subparsers.add_parser("generate", help="complete one raw prompt and print only the generated text")
    gen.add_argument("prompt")
    add_engine_options(gen)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stats", action="store_true", help="print speculation stats to stderr at the end")
    gen.set_defaults(func=run_generate)

    pol = subparsers.add_parser("policy", help="show or change the speculation policy settings")
    pol.add_argument("action", choices=["show", "set"])
    pol.add_argument("assignments", nargs="*", metavar="KEY=VALUE", help="for set: e.g. mode=auto k_max=6")
    pol.add_argument("--policy-file", type=Path, default=DEFAULT_POLICY_FILE)
    pol.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000 (uses /admin/policy)")
    pol.add_argument("--admin-key", default=os.environ.get("SPECSERVE_ADMIN_KEY"))
    pol.set_defaults(func=run_policy)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    draft = None if args.draft_model.lower() == "none" else args.draft_model
    mode = args.speculation or load_policy_file(args.policy_file).get("mode", "auto")
    return EngineConfig(model=args.model, draft_model=draft, draft_quantization=args.draft_quantization,
                        device=args.device, dtype=args.dtype,
                        speculation=mode, k=args.k, k_max=max(args.k, args.k_max))


def load_policy_file(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"specserve: {path}: invalid JSON ({exc})") from None


def build_llm_engine(args: argparse.Namespace):
    """An LLMEngine for the CLI: settings from flags, then the policy file on top of them."""
    from tqdm import tqdm

    from engine.engine import LLMEngine
    from policies import PolicyController, PolicySettings

    config = engine_config(args)
    base = PolicySettings(mode=config.speculation, k=config.k, k_max=config.k_max, seed=config.seed)
    stored = {k: v for k, v in load_policy_file(args.policy_file).items() if k != "mode"}
    settings = PolicySettings.from_dict(stored, base=base)
    bar = tqdm(total=2 if config.draft_model else 1, desc="loading models", file=sys.stderr, leave=False)
    engine = LLMEngine(config, policy=PolicyController(settings), progress=lambda _: bar.update())
    bar.close()
    return engine


def run_generate(args: argparse.Namespace) -> int:
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed)  # validated before the slow model load
        engine = build_llm_engine(args)
        engine.add_request(uuid.uuid4().hex, engine.tokenizer.encode(args.prompt), params)
    except (EngineError, ValueError) as exc:
        print(f"specserve: error: {exc}", file=sys.stderr)
        return 2
    final = None
    while engine.has_work():
        for out in engine.step():
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
            if out.finished:
                final = out
    sys.stdout.write("\n")
    if args.stats and final is not None and final.spec is not None:
        print(json.dumps({"finish_reason": final.finish_reason, "completion_tokens": final.num_output_tokens,
                          "speculation": final.spec.to_dict()}), file=sys.stderr)
    return 0


def run_policy(args: argparse.Namespace) -> int:
    from policies import PolicySettings, PolicySettingsError

    changes = {}
    for item in args.assignments:
        key, sep, raw = item.partition("=")
        if not sep:
            print(f"specserve: expected KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        try:
            changes[key] = json.loads(raw)
        except json.JSONDecodeError:
            changes[key] = raw  # bare strings such as mode=auto
    if args.url:
        return _remote_policy(args, changes)
    try:
        current = PolicySettings.from_dict(load_policy_file(args.policy_file))
        if args.action == "set":
            current = PolicySettings.from_dict(changes, base=current)
            args.policy_file.parent.mkdir(parents=True, exist_ok=True)
            args.policy_file.write_text(json.dumps(current.to_dict(), indent=2) + "\n")
    except PolicySettingsError as exc:
        print(f"specserve: invalid policy setting: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(current.to_dict(), indent=2))
    return 0


def _remote_policy(args: argparse.Namespace, changes: dict) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {args.admin_key}"} if args.admin_key else {}
    url = args.url.rstrip("/") + "/admin/policy"
    resp = httpx.patch(url, json=changes, headers=headers) if args.action == "set" else httpx.get(url, headers=headers)
    print(json.dumps(resp.json(), indent=2))
    return 0 if resp.is_success else 2
