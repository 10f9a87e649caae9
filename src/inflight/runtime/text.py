"""Tokenization in the backend: the ``text`` input (BYTES, one UTF-8 string per item).

A model that declares a ``text`` input takes raw strings instead of ``input_ids`` and
``attention_mask``; :class:`TextEncoder` turns each request's strings into those two arrays with
the checkpoint's own Hugging Face ``tokenizer.json``. It is used once per gathered batch: every valid
item of every request is tokenized at once, and a bad request gets its own
:class:`~inflight.errors.ValidationError` while the others are still answered. The text of a BERT
WordPiece tokenizer goes through the word cache (:mod:`inflight.runtime.wordpiece`: the same ids, about
ten times cheaper on English text, each text's ids as int64 bytes read by numpy once a request) unless it
holds a control character or an added token (as the library matches it); the rest in one
``Tokenizer.encode_batch_fast`` call (Rust, parallel, without the GIL; ``encode_batch`` on tokenizers older
than 0.21, which lack it: the fast one skips the character offsets, which nothing here reads).

This module imports no Triton code, and ``tokenizers`` only when an encoder is built, so the runtime
imports without it when no model takes text. Timing the encoding is the caller's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inflight.errors import ConfigError, ValidationError
from inflight.model_config import DEFAULT_MAX_TEXT_BYTES, DEFAULT_WORD_CACHE
from inflight.runtime.wordpiece import ID_BYTES, WordCache, ids_bytes

#: The name of the input that carries raw text.
TEXT_INPUT = "text"

_FIX_DTYPE = f"send the {TEXT_INPUT} input as BYTES of shape [n, 1], one UTF-8 string per item"


class TextEncoder:
    """Turns requests' ``text`` arrays into ``input_ids`` and ``attention_mask``.

    Args:
        tokenizer_path: The checkpoint's ``tokenizer.json`` (Hugging Face ``tokenizers`` format).
        max_len: Most tokens an item is truncated to, special tokens ([CLS], [SEP]) included
            (the model's ``max_seq_len``).
        max_bytes: Most UTF-8 bytes one item may hold; longer items are refused, not truncated.
        word_cache: Most chunks the word cache remembers (:mod:`inflight.runtime.wordpiece`); 0: every
            text through the ``tokenizers`` library.

    Raises:
        ConfigError: when ``tokenizers`` is not installed, the file is missing or unreadable, or
            ``max_len`` < 2, ``max_bytes`` < 1 or ``word_cache`` < 0.
    """

    def __init__(
        self,
        tokenizer_path: Path,
        *,
        max_len: int,
        max_bytes: int = DEFAULT_MAX_TEXT_BYTES,
        word_cache: int = DEFAULT_WORD_CACHE,
    ) -> None:
        if max_len < 2:
            raise ConfigError(
                f"text max_len is {max_len}; it must be at least 2 tokens to hold [CLS] and [SEP] "
                "(set it to the model's max_seq_len)"
            )
        if max_bytes < 1:
            raise ConfigError(f"text max_bytes is {max_bytes}; set it to a positive number of bytes")
        if word_cache < 0:
            raise ConfigError(f"tokenizer_word_cache is {word_cache}; set it to 0 (off) or a number of words")
        try:
            import tokenizers
        except ImportError as e:
            raise ConfigError(
                f"the {TEXT_INPUT!r} input needs the Hugging Face tokenizers package, which is not "
                f"installed ({e}); pip install tokenizers in the environment Triton's Python backend runs"
            ) from None
        path = Path(tokenizer_path)
        if not path.is_file():
            raise ConfigError(
                f"tokenizer file {str(path)!r} does not exist; point the model at the checkpoint's tokenizer.json"
            )
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises a plain Exception for unreadable/invalid files
            raise ConfigError(
                f"cannot load tokenizer file {str(path)!r}: {e}; it must be a Hugging Face tokenizer.json "
                "(save it with tokenizer.save(path) or AutoTokenizer.save_pretrained)"
            ) from None
        # the file's own padding/truncation (all-MiniLM-L6-v2 pads and truncates to 128) would pad every
        # item to a fixed length: pad per request here instead, and truncate to max_len with specials
        tok.no_padding()
        tok.enable_truncation(max_length=max_len)
        self._tok: Any = tok
        # the same ids without the per-token character offsets (tokenizers >= 0.21)
        self._encode: Any = getattr(tok, "encode_batch_fast", tok.encode_batch)
        self._path = path
        self._max_len = max_len
        self._max_bytes = max_bytes
        self._vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
        self._cache: WordCache | None = None
        self._cache_note = "off (tokenizer_word_cache 0)"
        if word_cache:
            self._cache, why_not = WordCache.for_tokenizer(tok, max_len=max_len, size=word_cache)
            self._cache_note = f"up to {word_cache} chunks" if self._cache else f"off: {why_not}"
        #: texts encoded by the ``tokenizers`` library (not the word cache) since the encoder was built
        self.library_texts = 0

    @property
    def tokenizer_path(self) -> Path:
        """The ``tokenizer.json`` the encoder was loaded from."""
        return self._path

    @property
    def max_len(self) -> int:
        """Most tokens per item, special tokens included."""
        return self._max_len

    @property
    def max_bytes(self) -> int:
        """Most UTF-8 bytes per item."""
        return self._max_bytes

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer can produce (added tokens included)."""
        return self._vocab_size

    def describe(self) -> str:
        """One line for the load log."""
        return (
            f"text tokenizer {self._path} (vocab {self._vocab_size}, max_len {self._max_len} tokens, "
            f"max_bytes {self._max_bytes}; word cache: {self._cache_note})"
        )

    def encode_batch(self, requests: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray] | ValidationError]:
        """Tokenize the ``text`` arrays of several requests at once.

        Args:
            requests: Each request's ``text`` array: shape [n, 1] (or [n]) of ``bytes`` (or ``str``).

        Returns:
            One entry per request, in order: ``(input_ids, attention_mask)``, int64 arrays of shape
            [n, L] where L is the request's longest tokenized item (shorter items padded with id 0
            and mask 0), or the :class:`ValidationError` that refuses the request.
        """
        out: list[tuple[np.ndarray, np.ndarray] | ValidationError | None] = []
        texts: list[str] = []
        spans: list[tuple[int, int]] = []  # per valid request: its texts' [start, stop) in ``texts``
        for a in requests:
            got = self._texts(a)
            if isinstance(got, ValidationError):
                out.append(got)
            else:
                spans.append((len(texts), len(texts) + len(got)))
                texts.extend(got)
                out.append(None)
        if texts:
            try:
                ids = self._ids(texts)
            except Exception:  # one request's text broke the tokenizer: find it, answer the others
                ids = None
            done = iter(spans)
            for r, entry in enumerate(out):
                if entry is not None:
                    continue
                start, stop = next(done)
                out[r] = self._arrays(ids[start:stop]) if ids is not None else self._encode_alone(texts[start:stop])
        return [e for e in out if e is not None]

    def _ids(self, texts: list[str]) -> list[bytes]:
        """Each text's ids as int64 bytes: the word cache's where it takes the text, the library's (one call) else."""
        cache = self._cache
        ids: list[bytes | None] = [cache.encode(t) for t in texts] if cache is not None else [None] * len(texts)
        rest = [i for i, got in enumerate(ids) if got is None]
        if rest:
            encodings = self._encode([texts[i] for i in rest], add_special_tokens=True)
            self.library_texts += len(rest)
            for i, e in zip(rest, encodings, strict=True):
                ids[i] = ids_bytes(e.ids)
        return ids  # type: ignore[return-value]  # every None was filled

    def _encode_alone(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray] | ValidationError:
        try:
            ids = self._ids(texts)
        except Exception as e:
            return ValidationError(
                f"the tokenizer failed on the {TEXT_INPUT!r} input ({e}); send plain UTF-8 text", "text_tokenize"
            )
        return self._arrays(ids)

    def _arrays(self, encoded: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray] | ValidationError:
        lengths = np.fromiter(map(len, encoded), np.int64, count=len(encoded)) // ID_BYTES
        if int(lengths.min()) == 0:
            i = int(np.argmin(lengths))
            return ValidationError(
                f"{TEXT_INPUT!r} item {i} has no tokens once normalized (control or unknown characters only); "
                "send text with words in it",
                "text_empty",
            )
        longest = int(lengths.max())
        valid = np.arange(longest) < lengths[:, None]
        ids = np.zeros((len(encoded), longest), np.int64)
        # a boolean mask selects row-major, which is the order the ids are joined in
        ids[valid] = np.frombuffer(b"".join(encoded), np.int64)
        return ids, valid.astype(np.int64)

    def _texts(self, a: Any) -> list[str] | ValidationError:
        """The request's items as str, or why it is refused."""
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "OSU":
            what = f"datatype {a.dtype}" if isinstance(a, np.ndarray) else f"a {type(a).__name__}"
            return ValidationError(f"input {TEXT_INPUT!r} is {what}; {_FIX_DTYPE}", "text_dtype")
        if not (a.ndim == 1 or (a.ndim == 2 and a.shape[1] == 1)):
            return ValidationError(f"input {TEXT_INPUT!r} has shape {list(a.shape)}; {_FIX_DTYPE}", "text_dtype")
        if a.shape[0] == 0:
            return ValidationError("empty request: the batch dimension is 0; send at least one item", "empty_batch")
        limit = self._max_bytes
        texts: list[str] = []
        for i, item in enumerate(a.reshape(-1).tolist()):
            if isinstance(item, bytes):
                size = len(item)
                if size > limit:
                    return _too_long(i, size, limit)
                try:
                    s = item.decode("utf-8")
                except UnicodeDecodeError as e:
                    return ValidationError(
                        f"{TEXT_INPUT!r} item {i} is not valid UTF-8 ({e.reason} at byte {e.start}); "
                        "encode the text as UTF-8",
                        "text_not_utf8",
                    )
            elif isinstance(item, str):
                s = item
                if len(s) > limit:  # every character is at least one byte
                    return _too_long(i, None, limit)
                try:
                    size = len(s.encode("utf-8"))
                except UnicodeEncodeError as e:
                    return ValidationError(
                        f"{TEXT_INPUT!r} item {i} cannot be encoded as UTF-8 ({e.reason} at character {e.start}); "
                        "send valid Unicode text",
                        "text_not_utf8",
                    )
                if size > limit:
                    return _too_long(i, size, limit)
            else:
                return ValidationError(
                    f"{TEXT_INPUT!r} item {i} is a {type(item).__name__}, not bytes; {_FIX_DTYPE}", "text_dtype"
                )
            if not s or s.isspace():
                return ValidationError(
                    f"{TEXT_INPUT!r} item {i} is empty or whitespace only; send at least one word per item",
                    "text_empty",
                )
            texts.append(s)
        return texts


def _too_long(i: int, size: int | None, limit: int) -> ValidationError:
    held = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return ValidationError(
        f"{TEXT_INPUT!r} item {i} holds {held}, over the limit of {limit} UTF-8 bytes per item; "
        "split the text into several items (only the first max_len tokens of an item are used anyway)",
        "text_too_long",
    )
