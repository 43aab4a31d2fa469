"""Engine configuration: a frozen dataclass validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SPECULATION = ("auto", "off", "draft", "ngram")


@dataclass(frozen=True)
class EngineConfig:
    model: str = str(DEFAULT_TARGET)
    draft_model: str | None = str(DEFAULT_DRAFT)  # None disables the draft proposer
    device: str = "auto"  # auto = cuda when present, else cpu
    dtype: str = "auto"  # auto = float32 on CPU, bfloat16 on CUDA
    max_running: int = 32
    max_waiting: int = 256
    max_seq_len: int = 1024
    max_num_batched_tokens: int = 512  # per-step token budget; long prompts are prefilled in chunks
    kv_cache: str = "paged"  # paged | slotted
    block_size: int = 16
    num_kv_blocks: int | None = None  # None = enough for max_running full-length requests
    speculation: str = "auto"  # auto | off | draft | ngram
    k: int = 4  # draft length of the fixed modes
    k_max: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    seed: int = 0  # seeds requests that bring no seed of their own

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N]; got {self.device!r}")
        if self.speculation not in SPECULATION:
            raise ValueError(f"speculation must be one of {', '.join(SPECULATION)}; got {self.speculation!r}")
        if self.kv_cache not in ("paged", "slotted"):
            raise ValueError(f"kv_cache must be paged or slotted; got {self.kv_cache!r}")
        for name in ("max_running", "max_waiting", "max_seq_len", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 1 <= self.k <= self.k_max <= 16:
            raise ValueError(f"need 1 <= k ({self.k}) <= k_max ({self.k_max}) <= 16")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]
