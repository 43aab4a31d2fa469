"""IncrementalDetokenizer on the bundled tokenizer: deltas, UTF-8 safety, stop strings across token boundaries."""

from __future__ import annotations

import pytest

from engine.models.tokenizer import IncrementalDetokenizer, load_tokenizer
from tests.conftest import TARGET

MULTIBYTE = "héllo wörld ✓ 日本語"
PROMPT = "Say something:"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TARGET)


def stream(tok, text: str, stop: tuple[str, ...] = (), prompt: str = PROMPT):
    """Feed ``text``'s tokens one at a time; returns (deltas, stopped_at_index or None, detokenizer)."""
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode(prompt), stop)
    deltas = []
    for i, tid in enumerate(ids):
        delta, stopped = detok.add([tid])
        deltas.append(delta)
        if stopped:
            return deltas, i, detok
    deltas.append(detok.flush())
    return deltas, None, detok


@pytest.mark.parametrize("text", [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "hello world, stop here please",
    MULTIBYTE,
    "  leading spaces and\ttabs\n\nnew lines  ",
])
def test_deltas_concatenate_to_the_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    deltas, stopped, _ = stream(tok, text)
    assert stopped is None
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True) == text


def test_never_emits_a_partial_utf8_character(tok):
    ids = tok.encode(MULTIBYTE, add_special_tokens=False)
    # the test only means something if some tokens carry part of a character
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    deltas, _, _ = stream(tok, MULTIBYTE)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == MULTIBYTE
    assert "" in deltas  # incomplete characters were held back, not emitted


def test_without_stop_strings_text_is_emitted_as_soon_as_it_is_whole(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode(PROMPT), ())
    emitted = ""
    for i, tid in enumerate(ids):
        delta, stopped = detok.add([tid])
        emitted += delta
        assert not stopped
        assert emitted == tok.decode(ids[: i + 1])
    assert detok.flush() == ""


def test_adding_several_tokens_at_once(tok):
    ids = tok.encode(MULTIBYTE, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode(PROMPT), ())
    out = "".join(detok.add(ids[i:i + 3])[0] for i in range(0, len(ids), 3)) + detok.flush()
    assert out == MULTIBYTE


@pytest.mark.parametrize(("text", "stop"), [
    ("hello world, stop here please", "op he"),  # spans " stop" | " here"
    ("hello world, stop here please", ", st"),
    ("hello world, stop here please", "d, stop here p"),  # spans five tokens
    ("hello world, stop here please", "lease"),  # ends exactly at the end of the text
    ("hello world, stop here please", "hello"),  # at the very start
    ("héllo wörld ✓ 日本語 and more", "✓ 日"),  # multi-byte characters inside the stop string
])
def test_stop_string_spanning_tokens_is_caught_and_cut(tok, text, stop):
    ids = tok.encode(text, add_special_tokens=False)
    deltas, stopped, detok = stream(tok, text, (stop,))
    assert stopped is not None, "the stop string was not detected"
    emitted = "".join(deltas)
    assert emitted == text[: text.index(stop)]
    # it stopped at the token that completed the stop string, not later
    assert stop in tok.decode(ids[: stopped + 1]) and stop not in tok.decode(ids[:stopped])
    assert detok.flush() == ""  # nothing after the stop is emitted
    assert all(stop not in d for d in deltas)


def test_no_part_of_a_stop_string_leaks_before_it_completes(tok):
    text = "hello world, stop here please"
    stop = "stop here"
    deltas, stopped, _ = stream(tok, text, (stop,))
    assert stopped is not None
    # every prefix the caller saw is a prefix of the final text, which excludes the whole stop string
    seen = ""
    for d in deltas:
        seen += d
        assert text.startswith(seen) and len(seen) <= text.index(stop)


def test_earliest_of_several_stop_strings_wins(tok):
    text = "hello world, stop here please"
    deltas, stopped, _ = stream(tok, text, ("please", "world", "here"))
    assert stopped is not None and "".join(deltas) == "hello "


def test_held_back_text_is_released_by_flush(tok):
    text = "hello world"
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, tok.encode(PROMPT), ("xyz",))
    emitted = "".join(detok.add([t])[0] for t in ids)
    assert emitted == text[:-2]  # the last len("xyz") - 1 characters could start the stop string
    assert detok.flush() == text[-2:]


def test_stop_string_in_the_prompt_does_not_stop(tok):
    deltas, stopped, _ = stream(tok, " and then more", ("STOP",), prompt="please STOP")
    assert stopped is None and "".join(deltas) == " and then more"


def test_special_tokens_are_skipped(tok):
    ids = tok.encode("hi", add_special_tokens=False) + [tok.eos_token_id]
    detok = IncrementalDetokenizer(tok, tok.encode(PROMPT), ())
    out = "".join(detok.add([t])[0] for t in ids) + detok.flush()
    assert out == "hi"
