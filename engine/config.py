"""Engine configuration: a frozen dataclass validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SPECULATION = ("auto", "off", "draft", "ngram")
DRAFT_QUANTIZATION = ("auto", "none", "int8")  # auto: int8 on a CPU (engine/models/int8.py), none elsewhere


@dataclass(frozen=True)
class EngineConfig:
    model: str = str(DEFAULT_TARGET)
    draft_model: str | None = str(DEFAULT_DRAFT)  # None disables the draft proposer
    draft_quantization: str = "auto"  # the draft model's linears: auto | none | int8 (CPU only)
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
        if self.draft_quantization not in DRAFT_QUANTIZATION:
            raise ValueError(f"draft_quantization must be one of {', '.join(DRAFT_QUANTIZATION)}; "
                             f"got {self.draft_quantization!r}")
        if self.draft_quantization == "int8" and self.torch_device.type != "cpu":
            raise ValueError("draft_quantization int8 runs on a CPU only; use auto or none on "
                             f"{self.torch_device.type}")
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
    def draft_int8(self) -> bool:
        """Whether the draft model's linears run as int8 (where this torch can: `quantize_linears_int8`)."""
        return self.draft_quantization == "int8" or (self.draft_quantization == "auto"
                                                     and self.torch_device.type == "cpu")

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]
