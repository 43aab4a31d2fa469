"""GatewaySettings (the one env reader) and the `specserve` CLI."""

from __future__ import annotations

import pytest

from gateway import cli
from gateway.settings import DEFAULT_DRAFT_MODEL, DEFAULT_MODEL, GatewaySettings

ENV_NAMES = {
    "host": "SPECSERVE_HOST", "port": "SPECSERVE_PORT", "model": "SPECSERVE_MODEL",
    "draft_model": "SPECSERVE_DRAFT_MODEL", "draft_quantization": "SPECSERVE_DRAFT_QUANTIZATION",
    "device": "SPECSERVE_DEVICE", "dtype": "SPECSERVE_DTYPE",
    "max_running": "SPECSERVE_MAX_RUNNING", "max_seq_len": "SPECSERVE_MAX_SEQ_LEN",
    "num_kv_blocks": "SPECSERVE_NUM_KV_BLOCKS", "max_waiting": "SPECSERVE_MAX_WAITING",
    "speculation": "SPECSERVE_SPECULATION", "spec_k": "SPECSERVE_SPEC_K", "k_max": "SPECSERVE_K_MAX",
    "redis_url": "SPECSERVE_REDIS_URL", "api_keys": "SPECSERVE_API_KEYS", "api_keys_file": "SPECSERVE_API_KEYS_FILE",
    "admin_key": "SPECSERVE_ADMIN_KEY", "rate_limit_rpm": "SPECSERVE_RATE_LIMIT_RPM",
    "rate_limit_tpm": "SPECSERVE_RATE_LIMIT_TPM", "request_ttl_s": "SPECSERVE_REQUEST_TTL_S",
    "store_prompts": "SPECSERVE_STORE_PROMPTS", "otlp_endpoint": "SPECSERVE_OTLP_ENDPOINT",
    "drain_timeout_s": "SPECSERVE_DRAIN_TIMEOUT_S", "keepalive_s": "SPECSERVE_KEEPALIVE_S",
    "max_body_bytes": "SPECSERVE_MAX_BODY_BYTES",
    "log_level": "SPECSERVE_LOG_LEVEL",
}
ENV_VALUES = {
    "host": ("0.0.0.0", "0.0.0.0"), "port": ("9001", 9001), "model": ("/m/target", "/m/target"),
    "draft_model": ("/m/draft", "/m/draft"), "draft_quantization": ("none", "none"), "device": ("cuda:1", "cuda:1"),
    "dtype": ("bfloat16", "bfloat16"),
    "max_running": ("7", 7), "max_seq_len": ("2048", 2048), "num_kv_blocks": ("99", 99), "max_waiting": ("5", 5),
    "speculation": ("ngram", "ngram"), "spec_k": ("3", 3), "k_max": ("6", 6), "redis_url": ("redis://r:6379/1",
    "redis://r:6379/1"), "api_keys": ("a,b", "a,b"), "api_keys_file": ("/keys", "/keys"), "admin_key": ("adm", "adm"),
    "rate_limit_rpm": ("60", 60), "rate_limit_tpm": ("1000", 1000), "request_ttl_s": ("120", 120),
    "store_prompts": ("true", True), "otlp_endpoint": ("http://otel:4318", "http://otel:4318"),
    "drain_timeout_s": ("12.5", 12.5), "keepalive_s": ("3", 3.0), "log_level": ("DEBUG", "debug"),
    "max_body_bytes": ("65536", 65536),
}


def test_defaults() -> None:
    s = GatewaySettings()
    assert (s.host, s.port, s.max_running, s.max_seq_len, s.max_waiting) == ("127.0.0.1", 8000, 32, 1024, 256)
    assert s.model == str(DEFAULT_MODEL) and s.draft_model == str(DEFAULT_DRAFT_MODEL)
    assert DEFAULT_MODEL.parts[-3:] == ("assets", "models", "target")
    assert s.served_model_name == "specserve-tiny"
    assert (s.speculation, s.spec_k, s.k_max, s.num_kv_blocks, s.redis_url) == ("auto", 4, 8, None, None)
    assert (s.rate_limit_rpm, s.rate_limit_tpm, s.request_ttl_s, s.store_prompts) == (0, 0, 3600, False)
    assert (s.drain_timeout_s, s.keepalive_s, s.log_level, s.otlp_endpoint) == (30, 15, "info", None)


def test_every_field_has_its_documented_env_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(ENV_NAMES) == set(GatewaySettings.model_fields) - {"served_model_name"}
    for field, env in ENV_NAMES.items():
        monkeypatch.setenv(env, ENV_VALUES[field][0])
    settings = GatewaySettings()
    for field, (_, expected) in ENV_VALUES.items():
        assert getattr(settings, field) == expected, field
    assert settings.served_model_name == "target"  # not the bundled pair: the model dir's name


def test_empty_and_none_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_DRAFT_MODEL", "none")
    monkeypatch.setenv("SPECSERVE_NUM_KV_BLOCKS", "")
    monkeypatch.setenv("SPECSERVE_REDIS_URL", "")
    s = GatewaySettings()
    assert s.draft_model is None and s.num_kv_blocks is None and s.redis_url is None


def test_serve_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSERVE_PORT", "9001")
    monkeypatch.setenv("SPECSERVE_MAX_RUNNING", "7")
    seen = {}
    monkeypatch.setattr(cli, "cmd_serve", lambda args: seen.update(vars(args)) or 0)
    parser = cli.build_parser()
    args = parser.parse_args(["serve", "--port", "9100", "--policy", "off", "--store-prompts",
                              "--draft-model", "none", "--redis-url", "redis://x:1/0"])
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "func")}
    assert overrides == {"port": 9100, "speculation": "off", "store_prompts": True, "draft_model": "none",
                         "redis_url": "redis://x:1/0"}
    s = GatewaySettings(**overrides)
    assert (s.port, s.max_running, s.speculation, s.draft_model) == (9100, 7, "off", None)


def test_every_setting_has_a_flag() -> None:
    flags = {field for field, *_ in cli.SERVE_FLAGS} | {"store_prompts"}
    assert flags == set(GatewaySettings.model_fields)


def test_invalid_settings_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--port", "70000"]) == 2
    assert "invalid settings" in capsys.readouterr().err
    assert cli.main(["serve", "--log-level", "loud"]) == 2


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "serve" in capsys.readouterr().err


def test_engine_commands_are_mounted_when_present() -> None:
    pytest.importorskip("engine.cli")
    commands = cli.build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    assert {"serve", "generate", "policy"} <= set(commands)
