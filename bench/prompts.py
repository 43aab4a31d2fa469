"""Held-out prompts for tests and benchmarks: stdlib code the pair never trained on, and English prose."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "dist-packages"}

PROSE = [
    "The history of the city begins with a small fishing village on the banks of the river, where",
    "In the morning the market opens early, and the first traders arrive with carts full of",
    "She opened the letter slowly, unsure of what it would say. The first line read:",
    "Photosynthesis is the process by which green plants use sunlight to",
    "The committee met on Tuesday to discuss the budget for the coming year. After a long debate,",
    "Once upon a time, in a kingdom by the sea, there lived a king who",
    "To make a good cup of tea, first boil fresh water, then",
    "The train was late again, so the passengers waited on the cold platform and",
]


def held_out_files() -> list[Path]:
    """Same split as scripts/train_tiny_pair.py: md5(relative path) % 20 == 0 is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts):
            continue
        if int(hashlib.md5(str(rel).encode()).hexdigest(), 16) % 20 == 0:
            files.append(path)
    return files


def code_prompts(n: int, max_chars: int = 400) -> list[str]:
    """Up to n prompts: a window of each held-out file, cut at a line end, ending mid-function."""
    prompts = []
    for path in held_out_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        start = text.find("\ndef ")
        if start == -1:
            start = text.find("\n    def ")
        if start == -1:
            continue
        window = text[start + 1: start + 1 + max_chars]
        window = window[: window.rfind("\n") + 1] if "\n" in window else window
        if len(window) > 40:
            prompts.append(window)
        if len(prompts) == n:
            break
    return prompts
