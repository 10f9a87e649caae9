"""The word cache gives the ``tokenizers`` library's own ids, and sends it what it does not reproduce."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inflight.errors import ConfigError
from inflight.model_config import ModelParameters
from inflight.runtime.text import TextEncoder
from inflight.runtime.wordpiece import WordCache

tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")


def _cased_template(path: Path, vocab_from: Path) -> Path:
    """A cased BERT tokenizer (no lowercasing) with a TemplateProcessing post-processor, of another file's vocab."""
    from tokenizers import models, normalizers, pre_tokenizers, processors

    ref = tokenizers.Tokenizer.from_file(str(vocab_from))
    tok = tokenizers.Tokenizer(models.WordPiece(ref.get_vocab(), unk_token="[UNK]", max_input_chars_per_word=20))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 101), ("[SEP]", 102)]
    )
    tok.add_special_tokens(["[CLS]", "[SEP]", "[MASK]"])
    tok.save(str(path))
    return path


def _corpus(n: int, seed: int) -> list[str]:
    """Texts meant to break a reimplementation: every printable ASCII character, whitespace of each kind, long
    words, added tokens written out (either case), control characters and non-ASCII letters."""
    rng = np.random.default_rng(seed)
    from inflight.loadtest.workload import WORDS

    pieces = [
        *WORDS[:200],
        *string.punctuation,
        *string.digits,
        "\t",
        "\n",
        "\r",
        "  ",
        "x" * 130,
        "Supercalifragilisticexpialidocious",
        "unbelievably",
        "ABC",
        "MiXeD",
        "3.14",
        "e-mail",
        "don't",
        "##ing",
        "[unused",
    ]
    # what the library must encode: an added token written out, control characters, non-ASCII letters
    library = ["[MASK]", "[mask]", "[CLS]", "\x00", "\x0b", "\x7f", "café", "東京", "naïve"]
    texts = []
    for _ in range(n):
        k = int(rng.integers(1, 60))
        joins = rng.choice(["", " "], size=k)
        words = [str(rng.choice(pieces)) + str(j) for j in joins]
        if rng.random() < 0.25:
            words.insert(int(rng.integers(0, k + 1)), str(rng.choice(library)))
        text = "".join(words)
        texts.append(text if text.strip() else "word")
    return texts


def _both(path: Path, max_len: int) -> tuple[TextEncoder, TextEncoder]:
    return TextEncoder(path, max_len=max_len), TextEncoder(path, max_len=max_len, word_cache=0)


def _ids_of(enc: TextEncoder, texts: list[str]) -> list[list[int]]:
    out = []
    for entry in enc.encode_batch([np.array([[t.encode()] for t in texts], dtype=object)]):
        assert not isinstance(entry, Exception), entry
        ids, mask = entry
        out += [row[m.astype(bool)].tolist() for row, m in zip(ids, mask, strict=True)]
    return out


@pytest.mark.parametrize("max_len", [2, 3, 16, 128, 512])
def test_the_cache_gives_the_library_ids_on_adversarial_texts(minilm: Path, max_len: int) -> None:
    cached, library = _both(minilm, max_len)
    texts = _corpus(600, seed=max_len)
    assert _ids_of(cached, texts) == _ids_of(library, texts)
    # most texts took the cache (the test would pass vacuously if every one went to the library)
    assert library.library_texts == len(texts)
    assert cached.library_texts < len(texts) // 2, cached.library_texts


def test_the_cache_gives_the_library_ids_on_the_load_tests_texts(minilm: Path) -> None:
    from inflight.loadtest.workload import WORDS

    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(np.array(WORDS), size=int(n))) for n in rng.integers(1, 300, size=300)]
    cached, library = _both(minilm, 128)
    assert _ids_of(cached, texts) == _ids_of(library, texts)
    assert cached.library_texts == 0


def test_a_cased_template_tokenizer_is_reproduced(tmp_path: Path, minilm: Path) -> None:
    path = _cased_template(tmp_path / "tokenizer.json", minilm)
    cached, library = _both(path, 64)
    assert "word cache: up to 65536 chunks" in cached.describe()
    texts = _corpus(400, seed=7)
    assert _ids_of(cached, texts) == _ids_of(library, texts)
    assert cached.library_texts < len(texts) // 2


def test_only_what_the_cache_cannot_reproduce_goes_to_the_library(minilm: Path) -> None:
    cached, _ = _both(minilm, 128)
    texts = ["plain words here", "tabs\tand\nnewlines", "café au lait", "a [MASK] b", "bell\x07", "ok!", "a\xa0b"]
    _ids_of(cached, texts)
    assert cached.library_texts == 2  # the added token, the control character


#: Chunks in several scripts, and the separators and marks the normalizer treats apart: no-break and ideographic
#: spaces, the line separator, a lone combining accent, final sigma, dotted capital I, an emoji, a CJK run.
UNICODE_PIECES = [
    "Café",
    "naïve",
    "RÉSUMÉ",
    "Ελληνικά",
    "ΟΔΟΣ",
    "İstanbul",
    "東京タワー",
    "中文分词测试没有空格的长句子" * 8,
    "مرحبا",
    "Привет",
    "😀",
    "e\u0301",
    "\u0301",
    "\u201cquoted\u201d",
    "it\u2019s",
    "\u2014",
    "\xa0",
    "\u3000",
    "\u2028",
    "x²",
    "ﬁ",
]


@pytest.mark.parametrize("max_len", [3, 16, 128])
def test_the_cache_gives_the_library_ids_on_text_in_many_scripts(minilm: Path, max_len: int) -> None:
    rng = np.random.default_rng(max_len)
    from inflight.loadtest.workload import WORDS

    pieces = [*UNICODE_PIECES, *WORDS[:50], *string.punctuation]
    texts = ["".join(str(rng.choice(pieces)) + str(rng.choice(["", " "])) for _ in range(40)) for _ in range(400)]
    texts = [t if t.strip() else "word" for t in texts]
    cached, library = _both(minilm, max_len)
    assert _ids_of(cached, texts) == _ids_of(library, texts)
    assert cached.library_texts == 0  # no control character, no added token: every text through the cache


def test_a_full_cache_starts_over_and_stays_right(minilm: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(minilm))
    tok.no_padding()
    tok.enable_truncation(max_length=64)
    cache, why = WordCache.for_tokenizer(tok, max_len=64, size=3)
    assert cache is not None and why == ""
    texts = _corpus(100, seed=3)
    for text in texts:
        got = cache.ids(text)
        if got is not None:
            assert got == tok.encode(text).ids
        assert len(cache._chunks) <= 3


def _pipeline(**parts: Any) -> Any:
    from tokenizers import models, normalizers, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "a": 3}
    tok = tokenizers.Tokenizer(parts.get("model") or models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = parts.get("normalizer", normalizers.BertNormalizer())
    tok.pre_tokenizer = parts.get("pre_tokenizer", pre_tokenizers.BertPreTokenizer())
    post = parts.get("post", processors.BertProcessing(("[SEP]", 2), ("[CLS]", 1)))
    if post is not None:
        tok.post_processor = post
    tok.enable_truncation(max_length=8)
    return tok


def test_a_pipeline_the_cache_does_not_reproduce_is_left_to_the_library_with_the_reason() -> None:
    from tokenizers import models, normalizers, pre_tokenizers, processors

    cases = {
        "normalizer": _pipeline(normalizer=normalizers.Lowercase()),
        "pre-tokenizer": _pipeline(pre_tokenizer=pre_tokenizers.Whitespace()),
        "model": _pipeline(model=models.BPE({"[UNK]": 0, "a": 1}, [], unk_token="[UNK]")),
        "post-processor": _pipeline(post=None),
        "template": _pipeline(post=processors.TemplateProcessing(single="$A $A", special_tokens=[])),
        "clean_text": _pipeline(normalizer=normalizers.BertNormalizer(clean_text=False)),
    }
    for what, tok in cases.items():
        cache, why = WordCache.for_tokenizer(tok, max_len=8, size=16)
        assert cache is None and what in why, (what, why)
    cache, why = WordCache.for_tokenizer(_pipeline(), max_len=8, size=16)
    assert cache is not None and why == ""
    # truncated elsewhere than max_len, or padding: the cache would keep other ids than the library
    untruncated = _pipeline()
    untruncated.no_truncation()
    for tok, max_len in ((_pipeline(), 16), (untruncated, 8)):  # truncating at 8, or not at all
        cache, why = WordCache.for_tokenizer(tok, max_len=max_len, size=16)
        assert cache is None and f"truncate at max_len {max_len}" in why
    padded = _pipeline()
    padded.enable_padding()
    assert "not pad" in WordCache.for_tokenizer(padded, max_len=8, size=16)[1]


#: Added tokens the library matches in a form other than their content: (token, a text holding it in that form).
_ADDED_TOKEN_CASES = [
    ({"content": "café", "normalized": True}, "cafe au lait"),  # matched once accents are stripped
    ({"content": "İstanbul", "normalized": True}, "istanbul"),
    ({"content": "a\u200bb", "normalized": True}, "ab"),  # the format character normalizes away
    ({"content": "Foo", "normalized": False}, "the Foo here"),
    ({"content": "[MASK]", "normalized": False, "special": True}, "a [MASK] b"),
    ({"content": "\n", "normalized": False, "special": True}, "a\nb"),  # whitespace: could span chunks
    ({"content": "\n", "normalized": True}, "a b"),
    ({"content": "new york", "normalized": True}, "new yo\ufffdrk"),
]


@pytest.mark.parametrize(("token", "text"), _ADDED_TOKEN_CASES)
def test_added_tokens_are_matched_as_the_library_matches_them(minilm: Path, token: dict[str, Any], text: str) -> None:
    from tokenizers import AddedToken

    tok = tokenizers.Tokenizer.from_file(str(minilm))
    tok.no_padding()
    tok.enable_truncation(max_length=128)
    added = AddedToken(token["content"], normalized=token["normalized"], special=token.get("special", False))
    (tok.add_special_tokens if token.get("special") else tok.add_tokens)([added])
    cache, why = WordCache.for_tokenizer(tok, max_len=128, size=64)
    if cache is None:  # the token could span two chunks: the whole tokenizer goes to the library, and says why
        assert repr(token["content"]) in why
        return
    for t in (text, text.upper(), f"x {text} y"):
        got = cache.ids(t)
        assert got is None or got == tok.encode(t).ids, (t, got, tok.encode(t).ids)
    assert cache.ids(text) is None  # the library's own match: the text is left to it


def test_the_word_cache_knob_is_checked_where_it_is_read(minilm: Path) -> None:
    assert ModelParameters.from_parameters({"tokenizer_word_cache": "0"}).tokenizer_word_cache == 0
    with pytest.raises(ConfigError, match="tokenizer_word_cache=-1"):
        ModelParameters.from_parameters({"tokenizer_word_cache": "-1"})
    with pytest.raises(ConfigError, match="set it to 0"):
        TextEncoder(minilm, max_len=16, word_cache=-5)
    assert "off (tokenizer_word_cache 0)" in TextEncoder(minilm, max_len=16, word_cache=0).describe()
