r"""The word cache: BERT WordPiece tokenization by remembered chunks, without the library's per-token pipeline.

Hugging Face ``tokenizers`` runs a BERT tokenizer (``BertNormalizer``, ``BertPreTokenizer``, ``WordPiece``, a
``[CLS] $A [SEP]`` template) at about 1 µs a token on one core, so on a server's cores tokenizing, not the GPU,
bounds an encoder served as text (docs/LAB.md, "The word cache"). That pipeline never joins what a space
separates: the normalizer works character by character (it drops control characters, turns whitespace into
spaces, lowercases, strips accents, spaces out CJK characters) and the pre-tokenizer splits at whitespace and
at punctuation. So a text's ids are its space-separated chunks' ids, in order, truncated, between the template's
special tokens. :class:`WordCache` remembers each chunk's ids:

* a plain ASCII chunk: lowercased (when the normalizer lowercases), split into runs of letters and digits and
  single punctuation marks (Rust's ``is_ascii_punctuation``: all 32), each through the library's own WordPiece
  model (``Tokenizer.model.tokenize``);
* any other chunk: the library's whole pipeline on the chunk alone (``Tokenizer.encode``).

Text repeats its chunks, so after a warm-up almost every chunk is one dictionary lookup; the ids are kept as
int64 bytes, so a text's are one ``bytes.join``. A text with a control or format character (which the
normalizer drops, possibly joining two chunks), or one of the tokenizer's added tokens in the form the library
matches it (``[MASK]`` as written, a normalized token normalized), goes to the library whole, as does every
text of a tokenizer whose pipeline is not the one above or that has an added token which could span two chunks.
The ids are the library's: the unit tests compare the two, id for id, on drawn and adversarial texts.
"""

from __future__ import annotations

import array
import json
import re
from collections.abc import Iterable
from typing import Any

#: An ASCII chunk's words: a run of letters and digits, or one punctuation mark (``!``-``/``, ``:``-``@``,
#: ``[``-`````, ``{``-``~``: Rust's ``is_ascii_punctuation``, which ``BertPreTokenizer`` splits on).
_WORDS = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")

#: The whitespace ``BertNormalizer``'s ``clean_text`` turns into a space: Unicode's White_Space characters less the
#: control characters among them (``\v``, ``\f``, U+0085), which it drops, plus tab, newline and return. A regular
#: expression, not ``str.translate``: translating a non-ASCII text cost 18.8 µs, searching it 1.1.
_SPACES = re.compile("[\t\n\r\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")

#: Chunks longer than this (characters) are computed but not remembered: a long run without spaces (CJK text,
#: a URL) rarely comes again.
_LONGEST_REMEMBERED = 64

#: Bytes of one id: ids are held as native int64 (``array`` typecode ``q``, numpy's ``int64``).
ID_BYTES = array.array("q").itemsize


def ids_bytes(ids: Iterable[int]) -> bytes:
    """Token ids as the native int64 bytes the cache holds, which ``numpy.frombuffer(b, np.int64)`` reads back."""
    return array.array("q", ids).tobytes()


class WordCache:
    """The ids of texts by remembered chunks, for a BERT WordPiece tokenizer (module docstring).

    Build it with :meth:`for_tokenizer`, which says why when the tokenizer's pipeline is not one it reproduces.

    Args:
        tokenizer: The ``tokenizers.Tokenizer`` (truncating at ``max_len``, not padding): its WordPiece model
            gives an ASCII chunk's ids on a miss, its whole pipeline any other chunk's.
        lowercase: Whether the normalizer lowercases.
        prefix: The template's ids before the text (``[CLS]``).
        suffix: The template's ids after it (``[SEP]``).
        max_len: Most ids of a text, special tokens included (the truncation length).
        added: What texts are searched for, an added token each, in the form the library matches it
            (``_added_pattern``); a text that holds one goes to the library.
        size: Most chunks remembered (``ModelParameters.tokenizer_word_cache``); when full, the cache starts over.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        lowercase: bool,
        prefix: list[int],
        suffix: list[int],
        max_len: int,
        added: list[str],
        size: int,
    ) -> None:
        if max_len < len(prefix) + len(suffix) or size < 1:
            raise ValueError(f"max_len {max_len} must hold the template's special tokens, and size {size} be >= 1")
        self._tok = tokenizer
        self._model = tokenizer.model
        self._lowercase = lowercase
        self._prefix = ids_bytes(prefix)
        self._suffix = ids_bytes(suffix)
        self._room = (max_len - len(prefix) - len(suffix)) * ID_BYTES  # bytes of the text's own ids kept
        self._added = tuple(dict.fromkeys(added))
        self._added_first = frozenset(a[0] for a in self._added)
        self._size = size
        self._chunks: dict[str, bytes] = {}  # what lies between two spaces -> its ids (int64 bytes)

    @classmethod
    def for_tokenizer(cls, tok: Any, *, max_len: int, size: int) -> tuple[WordCache | None, str]:
        """The cache for a loaded ``tokenizers.Tokenizer`` and "", or None and why its pipeline is not reproduced.

        Args:
            tok: The tokenizer, its truncation set to ``max_len`` and its padding off (as ``TextEncoder``
                sets them).
            max_len: The truncation length, special tokens included.
            size: Most words remembered.
        """
        spec = json.loads(tok.to_str())
        norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
        trunc = spec.get("truncation") or {}
        if norm.get("type") != "BertNormalizer":
            return None, f"its normalizer is {norm.get('type')!r} (the word cache reproduces BertNormalizer)"
        if not norm.get("clean_text", True):
            return None, "its BertNormalizer keeps control characters (clean_text false)"
        if pre.get("type") != "BertPreTokenizer":
            return None, f"its pre-tokenizer is {pre.get('type')!r} (the word cache reproduces BertPreTokenizer)"
        if model.get("type") != "WordPiece":
            return None, f"its model is {model.get('type')!r} (the word cache reproduces WordPiece)"
        if trunc.get("direction", "Right") != "Right" or trunc.get("stride", 0) != 0:
            return None, "its truncation is not from the right without stride"
        if trunc.get("max_length") != max_len or spec.get("padding"):
            return None, f"the tokenizer must truncate at max_len {max_len} and not pad (as TextEncoder sets it)"
        specials = _template(spec.get("post_processor"))
        if specials is None:
            return None, "its post-processor is not a [CLS] $A [SEP]-style template"
        prefix, suffix = specials
        if max_len < len(prefix) + len(suffix):
            return None, f"max_len {max_len} does not hold the template's special tokens"
        lowercase = bool(norm.get("lowercase", True))
        added = []
        for t in spec.get("added_tokens") or []:
            found, why = _added_pattern(tok, t, lowercase)
            if found is None:
                return None, why
            added.append(found)
        cache = cls(
            tok,
            lowercase=lowercase,
            prefix=prefix,
            suffix=suffix,
            max_len=max_len,
            added=added,
            size=size,
        )
        return cache, ""

    def encode(self, text: str) -> bytes | None:
        """The text's ids as native int64 bytes (special tokens included, truncated), or None: it needs the library.

        Bytes, not a list of ints: a chunk's ids are remembered as bytes and a text's are their join, which
        ``numpy.frombuffer`` reads without a Python int per token (1.5x the texts a core tokenizes,
        ``scripts/lab/tokenizer_bound.py``; docs/LAB.md).
        """
        ascii_text = text.isascii()
        if (not ascii_text or "\t" in text or "\n" in text or "\r" in text) and _SPACES.search(text):
            text = _SPACES.sub(" ", text)
        if not text.isprintable():  # a control or format character: the normalizer drops it
            return None
        if self._lowercase and ascii_text:
            text = text.lower()  # exact for ASCII; other text keeps its case for the library
        folded = text.lower() if self._lowercase and not ascii_text else text
        if any(c in folded for c in self._added_first) and any(a in folded for a in self._added):
            return None
        # only spaces separate now: the chunks between them
        chunks = text.split()
        try:
            body = b"".join(map(self._chunks.__getitem__, chunks))
        except KeyError:  # a chunk not seen yet (or forgotten when the cache started over)
            get = self._chunks.get
            body = b"".join([g if (g := get(c)) is not None else self._learn(c) for c in chunks])
        if len(body) > self._room:
            body = body[: self._room]
        return self._prefix + body + self._suffix

    def ids(self, text: str) -> list[int] | None:
        """The text's ids as a list (:meth:`encode`'s, read), or None: the text needs the library."""
        got = self.encode(text)
        return None if got is None else array.array("q", got).tolist()

    def _learn(self, chunk: str) -> bytes:
        """A chunk's ids (int64 bytes), remembered unless it is long (module docstring)."""
        if chunk.isascii():
            ids: list[int] = []
            for word in _WORDS.findall(chunk.lower() if self._lowercase else chunk):
                ids += [t.id for t in self._model.tokenize(word)]
        else:  # truncated at max_len at most, more than a text keeps
            ids = list(self._tok.encode(chunk, add_special_tokens=False).ids)
        got = ids_bytes(ids)
        if len(chunk) <= _LONGEST_REMEMBERED:
            if len(self._chunks) >= self._size:
                self._chunks.clear()
            self._chunks[chunk] = got
        return got


def _added_pattern(tok: Any, token: dict[str, Any], lowercase: bool) -> tuple[str | None, str]:
    """What :meth:`WordCache.encode` searches a text for so as to leave texts holding ``token`` to the library.

    The library matches a ``normalized`` added token by its normalized content in the normalized text, any other by
    its content in the raw text. An ASCII chunk's normalized form is the chunk lowercased (when the normalizer
    lowercases), which is what ``encode`` searches: so the pattern is the normalized content, or the content
    lowercased. A non-ASCII chunk goes to the library whole, which matches the tokens in it itself. A content or
    pattern with whitespace (which could span two chunks) or control characters, or one that normalizes to
    nothing, is not reproduced: (None, why).
    """
    content = str(token.get("content") or "")
    pattern = tok.normalizer.normalize_str(content) if token.get("normalized") else content
    if not token.get("normalized") and lowercase:
        pattern = pattern.lower()
    if not pattern or any(c.isspace() or not c.isprintable() for c in content + pattern):
        return None, f"its added token {content!r} holds whitespace or control characters, or normalizes to nothing"
    return pattern, ""


def _template(post: dict[str, Any] | None) -> tuple[list[int], list[int]] | None:
    """The special ids before and after a single sequence, for the post-processors the cache reproduces."""
    if not post:
        return None
    if post.get("type") == "BertProcessing":
        return [int(post["cls"][1])], [int(post["sep"][1])]
    if post.get("type") != "TemplateProcessing":
        return None
    before: list[int] = []
    after: list[int] = []
    seen = False
    for piece in post.get("single") or []:
        if "Sequence" in piece:
            if seen or piece["Sequence"].get("id") != "A":
                return None
            seen = True
        elif "SpecialToken" in piece:
            token = (post.get("special_tokens") or {}).get(piece["SpecialToken"]["id"])
            if token is None:
                return None
            (after if seen else before).extend(int(i) for i in token["ids"])
        else:
            return None
    return (before, after) if seen else None
