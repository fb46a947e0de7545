"""Token counting and prefix-block hashing shared by the engines (emulated), the router and the gateway.

The router estimates a request's *uncached* length before sending it anywhere, so it must count tokens and
hash prefix blocks exactly as the engines do. Both use this module (never two implementations).

* :class:`ModelTokenizer` (what a real deployment runs): the served model's own tokenizer (a ``tokenizer.json``
  of the ``tokenizers`` library) and chat template (Jinja, as in ``tokenizer_config.json`` or
  ``chat_template.jinja``), so counts and token ids are the engine's own. Chats are rendered as vLLM renders
  them: text parts of a message joined with ``\\n``, the generation prompt appended, no special tokens added
  on top of the template's; completion prompts get the tokenizer's own special tokens (a BOS, where it has one).
* ``chars4`` (the fallback when no tokenizer file is configured): one token per 4 characters (the common rule
  of thumb for English BPE tokenizers); ids are a stable hash of each 4-character chunk, so the same text always
  gives the same ids and repeated prefixes hit prefix caches.
* ``whitespace``: one token per whitespace-separated word (ids hashed the same way).

The estimates render chats with a minimal template (``<|role|>\\ncontent\\n`` per message, then
``<|assistant|>\\n``), so the system prompt and earlier turns form a shared prefix like a real chat template.
Block hashes chain the parent's hash with the block's ids (vLLM's automatic prefix caching): block ``i``
matches only when the whole prefix up to it matches.
"""

from __future__ import annotations

import array
import hashlib
import re
import struct
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HfTokenizer

VOCAB_SIZE = 151_936
"""Ids fall in [0, VOCAB_SIZE) (Qwen's vocabulary size; any size works)."""

OUTPUT_WORDS = (" the", " and", " for", " you", " are", " was", " but", " not", " all", " can", " one", " out")
"""Generated tokens cycle through these: each is 4 characters, so ``chars4`` counts one token per word."""

TOKENIZERS = ("chars4", "whitespace")


class Tokenizer(Protocol):
    name: str
    """``chars4``, ``whitespace``, or ``model:<file>`` for a model's own tokenizer."""
    exact: bool
    """True when ids and counts are the engine's own (a model tokenizer), False for an estimate."""
    vocab_size: int
    """Token ids a client may send lie in ``[0, vocab_size)``."""

    def encode(self, text: str) -> list[int]:
        """A completion prompt's ids."""
        ...

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """A chat's ids: rendered by the chat template, generation prompt appended."""
        ...


_MIX = 0x9E3779B1
"""Knuth's multiplicative hash constant: spreads a short piece's bytes over the vocabulary."""


def _token_id(piece: str) -> int:
    """A piece's id: a piece of at most 4 bytes (UTF-8) is one little-endian word, mixed (what the estimate's fast path
    computes for 4 ASCII characters at once); a longer one its CRC-32."""
    data = piece.encode("utf-8")
    if len(data) <= 4:
        return int.from_bytes(data, "little") * _MIX % VOCAB_SIZE
    return zlib.crc32(data) % VOCAB_SIZE


class CharEstimateTokenizer:
    """One token per ``chars_per_token`` characters (the last chunk may be shorter)."""

    def __init__(self, chars_per_token: int = 4) -> None:
        if chars_per_token < 1:
            raise ValueError("chars_per_token must be >= 1")
        self.chars_per_token = chars_per_token
        self.name = f"chars{chars_per_token}"
        self.exact = False
        self.vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        n = self.chars_per_token
        if n == 4 and text.isascii():  # the text's words read at once: :func:`_token_id`'s ids, ~1.7x a CRC per slice
            data = text.encode("ascii")
            whole = len(data) - len(data) % 4
            words = array.array("I", data[:whole])
            if words.itemsize != 4:  # pragma: no cover - no mainstream platform
                words = array.array("L", struct.unpack(f"<{whole // 4}I", data[:whole]))
            elif sys.byteorder != "little":  # pragma: no cover
                words.byteswap()
            mix, vocab = _MIX, VOCAB_SIZE
            ids = [w * mix % vocab for w in words]
            if whole < len(data):
                ids.append(_token_id(text[whole:]))
            return ids
        return [_token_id(text[i : i + n]) for i in range(0, len(text), n)]

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(render_chat(messages))


class WhitespaceTokenizer:
    """One token per whitespace-separated word."""

    name = "whitespace"
    exact = False
    vocab_size = VOCAB_SIZE
    _word = re.compile(r"\S+")

    def encode(self, text: str) -> list[int]:
        return [_token_id(m.group()) for m in self._word.finditer(text)]

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.encode(render_chat(messages))


class ModelTokenizer:
    """The served model's own tokenizer and chat template (built from the files' contents: the shells read
    the files, the core does no I/O)."""

    def __init__(
        self,
        tokenizer_json: str,
        chat_template: str | None = None,
        template_tokens: Mapping[str, str] | None = None,
        name: str = "model",
    ) -> None:
        """``template_tokens``: the named special tokens a chat template may refer to (``bos_token``,
        ``eos_token``, from ``tokenizer_config.json``)."""
        try:
            self._tok = _HfTokenizer.from_str(tokenizer_json)
        except Exception as exc:  # the library raises its own exception type
            raise ValueError(f"not a tokenizer.json the tokenizers library can load: {exc}") from exc
        self.name = name
        self.exact = True
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self._template_tokens = dict(template_tokens or {})
        self._template = None
        if chat_template is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            try:
                self._template = env.from_string(chat_template)
            except Exception as exc:
                raise ValueError(f"chat template does not parse: {exc}") from exc

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL (encode does not): a long prompt tokenised off the event loop's thread
        # then does not stall the router's other requests (32K tokens take ~40 ms)
        return list(self._tok.encode_batch([text], add_special_tokens=True)[0].ids)

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The chat's prompt text as vLLM renders it (text parts joined with newlines, generation prompt)."""
        if self._template is None:
            raise ValueError("the model's tokenizer has no chat template: chat completions cannot be counted")
        normalised = normalise_messages(messages)
        return str(
            self._template.render(
                messages=normalised,
                add_generation_prompt=True,
                **{"bos_token": "", "eos_token": "", **self._template_tokens},
            )
        )

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        # vLLM tokenizes a rendered chat without adding special tokens: the template carries them
        return list(self._tok.encode_batch([self.render_chat(messages)], add_special_tokens=False)[0].ids)


def build_tokenizer(name: str) -> Tokenizer:
    if name == "chars4":
        return CharEstimateTokenizer(4)
    if name == "whitespace":
        return WhitespaceTokenizer()
    raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {name!r}")


def message_text(content: Any) -> str:
    """The text of a chat message's content: a string, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise ValueError("a content part must be an object")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError("a text content part needs a string 'text'")
                texts.append(text)
        return "\n".join(texts)  # as vLLM joins a message's text parts
    raise ValueError("message content must be a string or a list of content parts")


def normalise_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages checked (objects with a string ``role``) and with their content as text, as a chat
    template sees them. ValueError names what is wrong."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("every message must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError("every message needs a string 'role'")
        out.append({**message, "content": message_text(message.get("content"))})
    return out


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """The prompt text of a chat conversation (minimal template, generation prompt appended)."""
    out = [f"<|{m['role']}|>\n{m['content']}\n" for m in normalise_messages(messages)]
    out.append("<|assistant|>\n")
    return "".join(out)


def output_token(index: int) -> tuple[int, str]:
    """The ``index``-th generated token: (id, text)."""
    word = OUTPUT_WORDS[index % len(OUTPUT_WORDS)]
    return _token_id(word), word


def _le_u32(ids: Sequence[int]) -> bytes:
    """``ids`` as 4-byte little-endian integers (``array`` packs 50K ids in ~0.5 ms, ``struct`` with 50K
    arguments in ~2 ms)."""
    packed = array.array("I", ids)
    if packed.itemsize != 4:  # pragma: no cover - no mainstream platform
        return struct.pack(f"<{len(ids)}I", *ids)
    if sys.byteorder != "little":  # pragma: no cover
        packed.byteswap()
    return packed.tobytes()


def block_hashes(
    token_ids: Sequence[int], block_size: int, salt: str | None = None, parent: bytes = b""
) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block has none): block ``i``'s
    hash is BLAKE2b-128 of block ``i-1``'s hash followed by its ids as 4-byte little-endian integers. A ``salt``
    (the request's ``cache_salt``, as vLLM's prefix cache takes it into the first block's hash) starts the chain:
    prompts under different salts share no block. ``parent``: the hash of the block before the first, when
    ``token_ids`` continue a prefix (the salt is then already in it)."""
    n_full = len(token_ids) // block_size
    if n_full == 0:
        return []
    data = _le_u32(token_ids[: n_full * block_size])
    width = block_size * 4
    hashes: list[bytes] = []
    if salt and not parent:
        parent = hashlib.blake2b(b"cache_salt:" + salt.encode(), digest_size=16).digest()
    view, blake2b = memoryview(data), hashlib.blake2b  # no copy of each block's bytes
    for start in range(0, n_full * width, width):
        h = blake2b(parent, digest_size=16)
        h.update(view[start : start + width])
        parent = h.digest()
        hashes.append(parent)
    return hashes


class PrefixIndex:
    """Which instances of one cluster hold which prefix blocks, as the router learns it from what it routed.
    ``match`` returns, per instance, the tokens of the longest cached leading prefix.

    Built for the event loop it runs on (a 50K-token prompt is ~3,000 blocks, each request): a block's holders
    are a bit mask of instances (an int, which the cyclic GC does not track, where a quarter-million sets made
    its collections walk them all), and recency is two generations of plain dicts instead of an exact LRU: an
    insert goes to the young one, a block found in the old one moves up, and when the young one holds half the
    capacity it becomes the old one and the old one is dropped. An ``OrderedDict`` LRU at 262,144 blocks paused
    the loop up to ~110 ms on an insert (its compaction after evictions; measured), which every relayed stream
    waited for; this one evicts the blocks unused for a generation, never more than ``capacity_blocks`` kept."""

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self._young: dict[bytes, int] = {}
        self._old: dict[bytes, int] = {}
        self._bit: dict[str, int] = {}
        """Instance -> its bit in the masks."""

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def _names(self, mask: int) -> list[str]:
        return [name for name, bit in self._bit.items() if mask & bit]

    def _bit_of(self, instance: str) -> int:
        bit = self._bit.get(instance)
        if bit is None:
            used = 0
            for b in self._bit.values():
                used |= b
            bit = (used + 1) & ~used  # the lowest free bit
            self._bit[instance] = bit
        return bit

    def match(self, hashes: Sequence[bytes]) -> dict[str, int]:
        """Instance -> cached prefix tokens (leading blocks only): an instance's match ends at the first block it
        does not hold. O(log blocks) lookups per instance that drops out: what the index holds of a chain is a
        leading run whose holders only shrink along it (see :meth:`insert`), so the run's end and each holder's
        last block are found by bisection (a 27K-token prompt is ~1,700 blocks: a scan took ~100 us)."""
        n = len(hashes)
        young, old = self._young.get, self._old.get

        def holders(i: int) -> int:
            h = hashes[i]
            return young(h) or old(h, 0)

        first = holders(0) if n else 0
        if not first:
            return {}
        lo, hi = 0, n  # block lo is held; block hi is not (n: past the end)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            h = hashes[mid]
            if young(h) or old(h, 0):  # (holders(mid), inline: the loop runs ~11 times on a 27K-token prompt)
                lo = mid
            else:
                hi = mid
        out: dict[str, int] = {}
        last = holders(lo)
        spans = [(0, first, lo, last)] if first != last else []
        while spans:  # (i, its holders, j, its holders): someone held at i is not at j; split until adjacent
            i, at_i, j, at_j = spans.pop()
            if j - i == 1:
                for name in self._names(at_i & ~at_j):
                    out[name] = j * self.block_size
                continue
            mid = (i + j) // 2
            at_mid = holders(mid)
            if at_mid != at_i:
                spans.append((i, at_i, mid, at_mid))
            if at_mid != at_j:
                spans.append((mid, at_mid, j, at_j))
        for name in self._names(last):
            out[name] = (lo + 1) * self.block_size
        return out

    def insert(self, hashes: Sequence[bytes], instance: str) -> None:
        """``instance`` holds ``hashes`` (a prompt's chain, first block first). One prompt's blocks always land in
        the same generation, so the index keeps of any chain a leading run whose holders only shrink along it: a
        block's holders are among its parent's (each insert touching a block touched its parent before it, in the
        same generation or a later one), which :meth:`match` relies on. A prompt longer than half the capacity
        keeps its leading half."""
        if self.capacity_blocks <= 0:
            return
        bit = self._bit_of(instance)
        half = max(1, self.capacity_blocks // 2)
        if len(hashes) > half:
            hashes = hashes[:half]
        young = self._young
        for i, h in enumerate(hashes):
            holders = young.get(h)
            if holders is None:
                holders = self._old.pop(h, 0)
                if len(young) >= half:  # a new generation; the old one's blocks go, this prompt's so far move up
                    self._old, self._young = young, {}
                    young = self._young
                    for p in hashes[:i]:
                        moved = self._old.pop(p, None)
                        if moved is not None:
                            young[p] = moved
            young[h] = holders | bit

    def forget(self, instances: Iterable[str]) -> None:
        """Drop instances that left the cluster (or changed role)."""
        mask = 0
        for name in instances:
            mask |= self._bit.pop(name, 0)
        if not mask:
            return
        for gen in (self._young, self._old):
            for h, holders in list(gen.items()):
                if holders & mask:
                    if holders & ~mask:
                        gen[h] = holders & ~mask
                    else:
                        del gen[h]


def prompt_token_ids(body: dict[str, Any], chat: bool, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids as an OpenAI-compatible server counts them: a chat is rendered by the template
    and tokenized; a completion prompt is a string, a one-element list of strings, or token ids (kept as
    given). ValueError names the field."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        ids = tokenizer.encode_chat(messages)
        given = False
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        given = not isinstance(prompt, str)
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
        elif isinstance(prompt, list) and set(map(type, prompt)) <= {int}:  # exact ints: no bools, no floats
            ids = list(prompt)
        else:
            raise ValueError("'prompt' must be a string, a list with one string, or a list of token ids")
    if not ids:
        raise ValueError("'prompt' cannot be empty")
    # type set, min and max run in C: a 50K-token prompt is checked in ~4 ms, where generators took ~12 ms of the
    # GIL (measured), which every stream the router relays meanwhile waits for; ids the tokenizer made need none
    if given and (min(ids) < 0 or max(ids) >= tokenizer.vocab_size):
        raise ValueError(f"'prompt' token ids must lie in [0, {tokenizer.vocab_size}) (the model's vocabulary)")
    return ids
