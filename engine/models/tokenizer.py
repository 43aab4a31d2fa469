"""Tokenizer loading, chat templates, the draft/target compatibility check and incremental detokenisation."""

from __future__ import annotations

from pathlib import Path

from engine.errors import InvalidRequestError, ModelLoadError


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        raise ModelLoadError(f"{path}: no tokenizer.json or tokenizer.model")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - report any tokenizer failure as a load error
        raise ModelLoadError(f"{path}: cannot load the tokenizer ({exc})") from None


def eos_token_ids(tokenizer, config: dict) -> frozenset[int]:
    ids = config.get("eos_token_id")
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def check_compatible(target_tok, draft_tok, target_path: Path, draft_path: Path,
                     target_vocab: int, draft_vocab: int) -> None:
    """Draft tokens are verified by id, so both sides must mean the same thing by every id."""
    problems = []
    if target_vocab != draft_vocab:
        problems.append(f"config vocab_size {target_vocab} (target) != {draft_vocab} (draft)")
    if len(target_tok) != len(draft_tok):
        problems.append(f"tokenizer size {len(target_tok)} (target) != {len(draft_tok)} (draft)")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        a, b = getattr(target_tok, name), getattr(draft_tok, name)
        if a != b:
            problems.append(f"{name} {a} (target) != {b} (draft)")
    if not problems and target_tok.get_vocab() != draft_tok.get_vocab():
        problems.append("vocabularies map tokens to different ids")
    if problems:
        raise ModelLoadError(
            f"draft {draft_path} is not compatible with target {target_path}: " + "; ".join(problems)
        )


def apply_chat_template(tokenizer, messages: list[dict]) -> list[int]:
    if not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    if tokenizer.chat_template is None:
        raise InvalidRequestError("this model has no chat template; use /v1/completions", param="messages")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - template errors are the caller's messages being wrong
        raise InvalidRequestError(f"cannot apply the chat template: {exc}", param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Never emits a partial UTF-8 character (a trailing U+FFFD is held back until the next
    token completes it), and holds back the last ``max_stop - 1`` characters so a stop
    string spanning tokens is caught before any of it is sent.
    """

    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        # decode a few prompt tokens as context so leading-space rules match the full decode
        self.ids: list[int] = list(prompt_ids[-4:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all decoded output text
        self.sent = 0  # characters of self.text already emitted

    def add(self, token_ids: list[int]) -> tuple[str, bool]:
        """Returns (text delta, stopped)."""
        for tid in token_ids:
            self.ids.append(tid)
            prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=True)
            full = self.tokenizer.decode(self.ids[self.prefix_offset:], skip_special_tokens=True)
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                self.text += full[len(prefix):]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        # an occurrence starting before `sent` was whole at the previous call (we held back
        # max_stop - 1 characters), so it would have been caught then
        hits = [at for s in self.stop if (at := self.text.find(s, self.sent)) != -1]
        if hits:
            self.text = self.text[:min(hits)]
            return self.flush(), True
        end = max(self.sent, len(self.text) - self.hold)
        delta, self.sent = self.text[self.sent:end], end
        return delta, False

    def flush(self) -> str:
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta
