"""The gateway's settings: the one place environment variables (``SPECSERVE_*``) are read."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO_ROOT / "assets" / "models" / "target"
DEFAULT_DRAFT_MODEL = REPO_ROOT / "assets" / "models" / "draft"
DEFAULT_SERVED_MODEL_NAME = "specserve-tiny"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

_OPTIONAL_FIELDS = (
    "served_model_name", "num_kv_blocks", "redis_url", "api_keys", "api_keys_file", "admin_key", "otlp_endpoint",
)


class GatewaySettings(BaseSettings):
    """Every knob of ``specserve serve``. CLI flags are passed as init kwargs and so override the environment."""

    model_config = SettingsConfigDict(env_prefix="SPECSERVE_", extra="ignore", validate_default=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    model: str = str(DEFAULT_MODEL)
    draft_model: str | None = str(DEFAULT_DRAFT_MODEL)  # "none" (or empty) disables the draft model
    draft_quantization: str = "auto"  # the draft model's linears: auto (int8 on a CPU), none or int8
    served_model_name: str | None = None  # None: "specserve-tiny" for the bundled pair, else the model dir name
    device: str = "auto"
    dtype: str = "auto"
    max_running: int = Field(32, ge=1)
    max_seq_len: int = Field(1024, ge=2)
    num_kv_blocks: int | None = Field(None, ge=1)  # None: sized automatically by the engine
    max_waiting: int = Field(256, ge=0)
    speculation: str = "auto"  # the speculation policy: auto (adaptive), off, draft (fixed k), ngram (fixed k)
    spec_k: int = Field(4, ge=1)
    k_max: int = Field(8, ge=1)
    redis_url: str | None = None  # None: request state, rate limits and policy live in this process
    api_keys: str | None = None  # comma-separated
    api_keys_file: str | None = None  # one key per line; '#' starts a comment
    admin_key: str | None = None
    rate_limit_rpm: int = Field(0, ge=0)  # requests per minute per key; 0 = off
    rate_limit_tpm: int = Field(0, ge=0)  # tokens per minute per key; 0 = off
    request_ttl_s: int = Field(3600, ge=1)
    store_prompts: bool = False
    otlp_endpoint: str | None = None  # e.g. http://otel-collector:4318 ; None: no trace export
    drain_timeout_s: float = Field(30.0, ge=0)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)  # larger request bodies get 413 before parsing
    keepalive_s: float = Field(15.0, ge=0)  # SSE ping interval; 0 disables pings
    log_level: str = "info"

    @field_validator(*_OPTIONAL_FIELDS, mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("draft_model", mode="before")
    @classmethod
    def _draft_none(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("", "none", "off"):
            return None
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        value = value.lower()
        if value not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        return value

    @model_validator(mode="after")
    def _default_served_name(self) -> GatewaySettings:
        if self.served_model_name is None:
            bundled = Path(self.model).resolve() == DEFAULT_MODEL
            self.served_model_name = DEFAULT_SERVED_MODEL_NAME if bundled else Path(self.model).name
        return self

    @property
    def public_host(self) -> str:
        """The host to print in URLs: a wildcard bind address is reachable as localhost."""
        return "localhost" if self.host in ("0.0.0.0", "::", "") else self.host
