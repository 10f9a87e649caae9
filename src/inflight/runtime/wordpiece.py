r"""The word cache: BERT WordPiece tokenization of plain ASCII text without the per-token library pipeline.

Hugging Face ``tokenizers`` runs a BERT tokenizer (``BertNormalizer``, ``BertPreTokenizer``, ``WordPiece``, a
``[CLS] $A [SEP]`` template) at about 1 µs a token on one core, so on a server's cores tokenizing, not the GPU,
bounds an encoder served as text (docs/LAB.md, "Tokenizing cost"). For text that is printable ASCII and holds
none of the tokenizer's added tokens, that pipeline reduces to:

1. clean and normalize: whitespace (``\t``, ``\n``, ``\r``) becomes a space; lowercase when the normalizer
   does (accents and CJK characters, which the normalizer also handles, are not ASCII);
2. pre-tokenize: runs of letters and digits, and each ASCII punctuation mark alone (``is_ascii_punctuation``:
   all 32 of them);
3. each word's WordPiece ids, from the library's own model (``Tokenizer.model.tokenize``), remembered per
   chunk (what lies between two spaces: a word with its punctuation, ``world.``): text repeats its words, so
   after a warm-up almost every chunk is one dictionary lookup, with no regular expression run;
4. truncate to the encoder's length less the template's special tokens, then add them.

:class:`WordCache` does that, about 7x faster than ``encode_batch_fast`` on one core (LAB, "Tokenizing cost");
any other text (non-ASCII, control characters, an added token such as ``[MASK]`` written out), and every text
of a tokenizer whose pipeline is not the one above, goes to the library. The ids are the library's: the unit
tests compare the two on drawn and adversarial texts.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

#: Step 2 on ASCII text: a run of letters and digits, or one punctuation mark (``!``-``/``, ``:``-``@``,
#: ``[``-`````, ``{``-``~``: Rust's ``is_ascii_punctuation``, which ``BertPreTokenizer`` splits on).
_WORDS = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")

#: Step 1: the whitespace ``BertNormalizer``'s ``clean_text`` maps to a space; any other control character
#: (which it drops) sends the text to the library.
_SPACES = str.maketrans({9: 32, 10: 32, 13: 32})


class WordCache:
    """The ids of ASCII texts by remembered words, for a BERT WordPiece tokenizer (module docstring).

    Build it with :meth:`for_tokenizer`, which says why when the tokenizer's pipeline is not one it reproduces.

    Args:
        model: The tokenizer's WordPiece model (``Tokenizer.model``): it gives a word's ids on a miss.
        lowercase: Whether the normalizer lowercases.
        prefix: The template's ids before the text (``[CLS]``).
        suffix: The template's ids after it (``[SEP]``).
        max_len: Most ids of a text, special tokens included (the truncation length).
        added: Added tokens' contents (lowercased when the normalizer lowercases); a text that holds one goes
            to the library.
        size: Most chunks remembered (``ModelParameters.tokenizer_word_cache``); when full, the cache starts over.
    """

    def __init__(
        self,
        model: Any,
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
        self._model = model
        self._lowercase = lowercase
        self._prefix = prefix
        self._suffix = suffix
        self._keep = max_len - len(suffix)  # ids kept before the suffix, the prefix included
        self._added = tuple(dict.fromkeys(added))
        self._added_first = frozenset(a[0] for a in self._added)
        self._size = size
        self._chunks: dict[str, list[int]] = {}  # what lies between two spaces -> its ids

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
        if norm.get("type") != "BertNormalizer" or not norm.get("clean_text", True):
            return None, f"its normalizer is {norm.get('type')!r} (the word cache reproduces BertNormalizer)"
        if pre.get("type") != "BertPreTokenizer":
            return None, f"its pre-tokenizer is {pre.get('type')!r} (the word cache reproduces BertPreTokenizer)"
        if model.get("type") != "WordPiece":
            return None, f"its model is {model.get('type')!r} (the word cache reproduces WordPiece)"
        if trunc.get("direction", "Right") != "Right" or trunc.get("stride", 0) != 0:
            return None, "its truncation is not from the right without stride"
        specials = _template(spec.get("post_processor"))
        if specials is None:
            return None, "its post-processor is not a [CLS] $A [SEP]-style template"
        prefix, suffix = specials
        if max_len < len(prefix) + len(suffix):
            return None, f"max_len {max_len} does not hold the template's special tokens"
        added = [t["content"] for t in spec.get("added_tokens") or [] if t.get("content")]
        if norm.get("lowercase", True):  # the text is searched once lowercased
            added = [a.lower() for a in added]
        cache = cls(
            tok.model,
            lowercase=bool(norm.get("lowercase", True)),
            prefix=prefix,
            suffix=suffix,
            max_len=max_len,
            added=added,
            size=size,
        )
        return cache, ""

    def ids(self, text: str) -> list[int] | None:
        """The text's ids (special tokens included, truncated), or None: the text needs the library."""
        if "\t" in text or "\n" in text or "\r" in text:
            text = text.translate(_SPACES)
        if not (text.isascii() and text.isprintable()):
            return None
        if self._lowercase:
            text = text.lower()
        if any(c in text for c in self._added_first) and any(a in text for a in self._added):
            return None
        # only spaces are left: the chunks between them, each a word with its punctuation attached
        chunks = text.split()
        known = list(map(self._chunks.get, chunks))
        got: list[list[int]] = (
            [g if g is not None else self._learn(c) for g, c in zip(known, chunks, strict=True)]
            if None in known
            else known  # type: ignore[assignment]  # no None in it
        )
        out = [*self._prefix, *itertools.chain.from_iterable(got)]
        if len(out) > self._keep:
            del out[self._keep :]
        out += self._suffix
        return out

    def _learn(self, chunk: str) -> list[int]:
        """A chunk's ids: its words (step 2) through the library's WordPiece model (step 3)."""
        if len(self._chunks) >= self._size:
            self._chunks.clear()
        got: list[int] = []
        for word in _WORDS.findall(chunk):
            got += [t.id for t in self._model.tokenize(word)]
        self._chunks[chunk] = got
        return got


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
