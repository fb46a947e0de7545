"""Token estimates, the chat template and the filler output of the engine emulator."""

from __future__ import annotations

import pytest

from prfaas_core.request.tokens import (
    OUTPUT_WORDS,
    CharEstimateTokenizer,
    WhitespaceTokenizer,
    build_tokenizer,
    message_text,
    output_token,
    render_chat,
)


@pytest.mark.parametrize(("text", "tokens"), [("", 0), ("abc", 1), ("abcd", 1), ("abcde", 2), ("x" * 4000, 1000)])
def test_chars4_counts_one_token_per_four_characters(text: str, tokens: int) -> None:
    assert len(CharEstimateTokenizer(4).encode(text)) == tokens


def test_ids_are_stable_and_prefix_preserving() -> None:
    tok = build_tokenizer("chars4")
    a = tok.encode("You are a helpful assistant. Question one?")
    b = tok.encode("You are a helpful assistant. Question two!")
    assert tok.encode("You are a helpful assistant. Question one?") == a
    assert a[:8] == b[:8] and a != b


def test_whitespace_tokenizer_counts_words() -> None:
    assert len(WhitespaceTokenizer().encode("  one two\nthree\t four ")) == 4


def test_unknown_tokenizer_is_refused() -> None:
    with pytest.raises(ValueError, match="chars4, whitespace"):
        build_tokenizer("bpe")


def test_chat_template_makes_earlier_turns_a_shared_prefix() -> None:
    system = {"role": "system", "content": "Be brief."}
    one = render_chat([system, {"role": "user", "content": "hi"}])
    two = render_chat([system, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert one.endswith("<|assistant|>\n")
    assert two.startswith(one[: len(one) - len("<|assistant|>\n")])


def test_content_parts_join_their_text_with_newlines_and_reject_garbage() -> None:
    # vLLM 0.32 (chat content format "string") joins a message's text parts with "\n"; real engines showed it
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert message_text(parts) == "a\nb"
    with pytest.raises(ValueError, match="string or a list"):
        message_text(42)
    with pytest.raises(ValueError, match="role"):
        render_chat([{"content": "no role"}])


def test_output_words_are_one_chars4_token_each() -> None:
    tok = CharEstimateTokenizer(4)
    assert all(len(tok.encode(w)) == 1 for w in OUTPUT_WORDS)
    assert output_token(0)[1] == OUTPUT_WORDS[0]
    assert output_token(len(OUTPUT_WORDS))[1] == OUTPUT_WORDS[0]


@pytest.mark.parametrize("text", ["plain ascii text, a few words long.", "héllo wörld ✓ mixed", "abcdefg", "x"])
def test_chars4_ids_are_each_pieces_word_or_crc_on_either_path(text: str) -> None:
    # the ASCII fast path (the text's words at once) and the general one (piece by piece) give the same ids: a piece
    # of at most 4 bytes is its little-endian word, mixed; a longer one (UTF-8) its CRC
    import zlib

    from prfaas_core.request.tokens import VOCAB_SIZE

    pieces = [text[i : i + 4].encode() for i in range(0, len(text), 4)]
    want = [
        int.from_bytes(b, "little") * 0x9E3779B1 % VOCAB_SIZE if len(b) <= 4 else zlib.crc32(b) % VOCAB_SIZE
        for b in pieces
    ]
    assert CharEstimateTokenizer(4).encode(text) == want
    assert len(set(CharEstimateTokenizer(4).encode("abcdabceabcfabcg"))) == 4  # near pieces, apart ids


def test_a_tokenized_prompt_needs_no_range_check_but_given_ids_do() -> None:
    from prfaas_core.request.tokens import prompt_token_ids

    tok = CharEstimateTokenizer(4)
    assert prompt_token_ids({"prompt": "abcdefgh"}, False, tok) == tok.encode("abcdefgh")
    with pytest.raises(ValueError, match="token ids must lie in"):
        prompt_token_ids({"prompt": [1, tok.vocab_size]}, False, tok)
