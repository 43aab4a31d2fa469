"""The ``specserve`` console script: ``specserve serve`` (plus the engine's own subcommands)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from gateway.settings import GatewaySettings

# (settings field, flag, type, help); every flag overrides its SPECSERVE_<FIELD> environment variable.
SERVE_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("host", "--host", str, "bind address (default 127.0.0.1; 0.0.0.0 in containers)"),
    ("port", "--port", int, "port (default 8000; 0 picks a free one)"),
    ("model", "--model", str, "target model directory (default: the bundled assets/models/target)"),
    ("draft_model", "--draft-model", str, "draft model directory, or 'none' (default: assets/models/draft)"),
    ("draft_quantization", "--draft-quantization", str,
     "draft model's linears: auto (int8 on a CPU), none or int8; its numerics never change the output"),
    ("served_model_name", "--served-model-name", str, "model id in the API (default specserve-tiny / dir name)"),
    ("device", "--device", str, "cpu, cuda, cuda:N or auto"),
    ("dtype", "--dtype", str, "float32, bfloat16, float16 or auto"),
    ("max_running", "--max-running", int, "max requests in the running batch"),
    ("max_seq_len", "--max-seq-len", int, "max sequence length (prompt + completion)"),
    ("num_kv_blocks", "--num-kv-blocks", int, "KV-cache size in blocks (default: sized automatically)"),
    ("max_waiting", "--max-waiting", int, "waiting-queue bound; beyond it requests get 429"),
    ("speculation", "--speculation", str, "speculation policy: auto (adaptive), off, draft, ngram, ..."),
    ("spec_k", "--spec-k", int, "draft length k for fixed policies"),
    ("k_max", "--k-max", int, "max draft length"),
    ("redis_url", "--redis-url", str, "redis://host:6379/0 for shared request state, limits and policy"),
    ("api_keys", "--api-keys", str, "comma-separated API keys (none: the API is open)"),
    ("api_keys_file", "--api-keys-file", str, "file with one API key per line"),
    ("admin_key", "--admin-key", str, "key for /admin endpoints"),
    ("rate_limit_rpm", "--rate-limit-rpm", int, "requests per minute per key (0 = off)"),
    ("rate_limit_tpm", "--rate-limit-tpm", int, "tokens per minute per key (0 = off)"),
    ("request_ttl_s", "--request-ttl-s", int, "how long request records are kept"),
    ("otlp_endpoint", "--otlp-endpoint", str, "OTLP/HTTP collector, e.g. http://localhost:4318"),
    ("drain_timeout_s", "--drain-timeout-s", float, "on SIGTERM, how long in-flight requests may finish"),
    ("keepalive_s", "--keepalive-s", float, "SSE keep-alive ping interval (0 = off)"),
    ("max_body_bytes", "--max-body-bytes", int, "larger request bodies are refused with 413"),
    ("log_level", "--log-level", str, "critical, error, warning, info, debug or trace"),
)


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="start the OpenAI-compatible server",
                                  description="Serve the model pair over an OpenAI-compatible HTTP API.")
    for field, flag, kind, help_text in SERVE_FLAGS:
        extra = ("--policy",) if field == "speculation" else ()
        serve.add_argument(flag, *extra, dest=field, type=kind, help=help_text, default=argparse.SUPPRESS)
    serve.add_argument("--store-prompts", dest="store_prompts", action=argparse.BooleanOptionalAction,
                       default=argparse.SUPPRESS, help="keep prompts and outputs in request records")
    serve.set_defaults(func=cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserve", description="Speculative-decoding LLM server.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_serve_command(subparsers)
    try:
        from engine.cli import add_engine_commands
    except ImportError:
        pass
    else:
        add_engine_commands(subparsers)
    return parser


def configure_logging(level: str) -> None:
    numeric = logging.DEBUG if level == "trace" else getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_serve(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "func")}
    try:
        settings = GatewaySettings(**overrides)
    except ValidationError as exc:
        print(f"specserve serve: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    from gateway.app import create_app
    from gateway.server import run_server

    try:
        app = create_app(settings)
    except OSError as exc:  # e.g. an unreadable API keys file
        print(f"specserve serve: {exc}", file=sys.stderr)
        return 2
    return run_server(app.state.gateway, app)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
