"""The CLI: ``generate`` prints only the completion on stdout; bad flags exit 2; ``policy show|set`` round-trips.

Most tests call the console script's entry function in-process (``gateway.cli.main``, falling back to
``engine.cli`` mounted on a bare parser) and capture at the file-descriptor level, so anything written to
fd 1 by any library would show up. One test runs the real ``python -m gateway.cli`` in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.types import SamplingParams
from policies import PolicySettings
from tests.conftest import ROOT, TARGET

PROMPT = "def f(x):"
MAX_TOKENS = 8
HAS_GATEWAY_CLI = (ROOT / "gateway" / "cli.py").is_file()


def cli_main(argv: list[str]) -> int:
    if HAS_GATEWAY_CLI:
        from gateway.cli import main

        return main(argv)
    import engine.cli

    parser = argparse.ArgumentParser(prog="specserve")
    engine.cli.add_engine_commands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


@pytest.fixture
def run_cli(capfd, tmp_path):
    """Runs the CLI with a private policy file; returns (exit code, stdout, stderr)."""
    policy_file = tmp_path / "policy.json"

    def run(*argv: str, policy: bool = True) -> tuple[int, str, str]:
        extra = ["--policy-file", str(policy_file)] if policy else []
        capfd.readouterr()
        try:
            code = cli_main([*argv, *extra])
        except SystemExit as exc:  # argparse errors
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capfd.readouterr()
        return code, out, err

    run.policy_file = policy_file
    return run


@pytest.fixture(scope="module")
def expected_text() -> str:
    """The greedy completion of PROMPT, from the engine directly (the models may be placeholders)."""
    eng = LLMEngine(EngineConfig(model=str(TARGET), draft_model=None, device="cpu", dtype="float32",
                                 max_seq_len=64, max_running=1, speculation="off"))
    eng.add_request("ref", eng.tokenizer.encode(PROMPT), SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    text = ""
    while eng.has_work():
        text += "".join(out.new_text for out in eng.step())
    return text


# ---------------------------------------------------------------- generate


@pytest.mark.parametrize("speculation", ["off", "draft", "ngram"])
def test_generate_prints_only_the_completion(run_cli, expected_text, speculation):
    code, out, err = run_cli("generate", PROMPT, "--max-tokens", str(MAX_TOKENS), "--device", "cpu",
                             "--speculation", speculation, "--stats")
    assert code == 0, err
    assert out == expected_text + "\n"  # greedy: every speculation mode prints the same thing
    assert "loading models" not in out and "Traceback" not in err
    stats = json.loads(err.strip().splitlines()[-1])  # --stats goes to stderr
    assert stats["completion_tokens"] <= MAX_TOKENS and stats["finish_reason"] in ("stop", "length")
    if speculation == "off":
        assert stats["speculation"]["rounds"] == 0
    elif speculation == "draft":
        assert stats["speculation"]["proposers"]["draft"]["rounds"] > 0


def test_generate_with_a_float_draft_prints_the_same_text(run_cli, expected_text):
    """The draft model's int8 linears (the CPU default) change its acceptance at most, never the text."""
    code, out, err = run_cli("generate", PROMPT, "--max-tokens", str(MAX_TOKENS), "--device", "cpu",
                             "--speculation", "draft", "--draft-quantization", "none")
    assert code == 0, err
    assert out == expected_text + "\n"


def test_generate_int8_draft_on_cuda_exits_2(run_cli):
    code, out, err = run_cli("generate", PROMPT, "--device", "cuda", "--draft-quantization", "int8")
    assert code == 2 and out == "" and "int8 runs on a CPU only" in err


@pytest.mark.parametrize(("flags", "named"), [
    (["--temperature", "-1"], "temperature"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--top-p", "1.5"], "top_p"),
    (["--k", "20"], "k (20)"),
])
def test_generate_bad_values_exit_2(run_cli, flags, named):
    code, out, err = run_cli("generate", PROMPT, *flags)
    assert code == 2
    assert out == ""
    assert "error" in err and named in err and "Traceback" not in err


def test_generate_unknown_speculation_mode_is_an_argparse_error(run_cli):
    code, out, err = run_cli("generate", PROMPT, "--speculation", "sometimes")
    assert code == 2 and out == "" and "invalid choice" in err


def test_generate_prompt_too_long_exits_2(run_cli):
    code, out, err = run_cli("generate", "word " * 2000, "--max-tokens", "4", "--device", "cpu",
                             "--draft-model", "none")
    assert code == 2 and out == "" and "maximum context length" in err


@pytest.mark.slow
def test_console_script_in_a_subprocess(expected_text, tmp_path):
    """The real entry point: stdout carries the completion and nothing else; progress stays on stderr."""
    if HAS_GATEWAY_CLI:
        cmd = [sys.executable, "-m", "gateway.cli"]
    else:
        cmd = [sys.executable, "-c", "import argparse, sys, engine.cli as c; p = argparse.ArgumentParser(); "
               "c.add_engine_commands(p.add_subparsers()); a = p.parse_args(); sys.exit(a.func(a))"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*cmd, "generate", PROMPT, "--max-tokens", str(MAX_TOKENS), "--device", "cpu",
                           "--speculation", "draft", "--policy-file", str(tmp_path / "policy.json")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected_text + "\n"


# ---------------------------------------------------------------- policy


def test_policy_show_defaults(run_cli):
    code, out, err = run_cli("policy", "show")
    assert code == 0, err
    assert json.loads(out) == PolicySettings().to_dict()
    assert not run_cli.policy_file.exists()  # show never writes


def test_policy_set_round_trips_through_the_file(run_cli):
    code, out, err = run_cli("policy", "set", "k_max=6", "mode=ngram", "hysteresis=0.1")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["k_max"] == 6 and shown["mode"] == "ngram" and shown["hysteresis"] == 0.1
    assert json.loads(run_cli.policy_file.read_text()) == shown
    code, out, _ = run_cli("policy", "show")
    assert code == 0 and json.loads(out) == shown
    code, out, _ = run_cli("policy", "set", "k=2")  # later sets keep earlier ones
    assert code == 0 and json.loads(out) == {**shown, "k": 2}
    assert PolicySettings.from_dict(json.loads(run_cli.policy_file.read_text())).k_max == 6


@pytest.mark.parametrize(("assignment", "named"), [
    ("bogus=1", "bogus"),
    ("k_max=100", "k_max"),
    ("mode=sometimes", "mode"),
    ("ewma_weight=abc", "ewma_weight"),
])
def test_policy_set_bad_field_exits_2(run_cli, assignment, named):
    run_cli("policy", "set", "k_max=6")
    before = run_cli.policy_file.read_text()
    code, out, err = run_cli("policy", "set", assignment)
    assert code == 2 and out == ""
    assert named in err and "Traceback" not in err
    assert run_cli.policy_file.read_text() == before  # nothing written


def test_policy_set_needs_key_value(run_cli):
    code, out, err = run_cli("policy", "set", "k_max")
    assert code == 2 and "KEY=VALUE" in err and not Path(run_cli.policy_file).exists()
