"""The ``text`` input: tokenization in the backend with the checkpoint's own tokenizer.json."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inflight.errors import ConfigError, ValidationError
from inflight.runtime import text as text_module
from inflight.runtime.text import DEFAULT_MAX_TEXT_BYTES, TextEncoder

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "hello",
    "world",
    "a",
    "dog",
    "##s",
    ".",
    ",",
    "é",
]
CLS, SEP = VOCAB.index("[CLS]"), VOCAB.index("[SEP]")


def _texts(*items: Any) -> np.ndarray:
    """A request's text array as Triton hands it: object array of shape [n, 1]."""
    a = np.empty((len(items), 1), dtype=object)
    for i, item in enumerate(items):
        a[i, 0] = item
    return a


def _small_tokenizer(path: Path, *, post_processor: bool = True) -> Path:
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")
    from tokenizers import models, normalizers, pre_tokenizers, processors

    tok = tokenizers.Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if post_processor:
        tok.post_processor = processors.BertProcessing(("[SEP]", SEP), ("[CLS]", CLS))
    # like all-MiniLM-L6-v2's file: its own fixed padding and truncation, which the encoder must drop
    tok.enable_padding(length=16, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=16)
    tok.save(str(path))
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return _small_tokenizer(tmp_path / "tokenizer.json")


@pytest.fixture(params=["small", "minilm"])
def tokenizer_file(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(request.param))


def _reference(path: Path, max_len: int) -> Any:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    return tok


def _ok(entry: tuple[np.ndarray, np.ndarray] | ValidationError) -> tuple[np.ndarray, np.ndarray]:
    assert not isinstance(entry, ValidationError), entry
    return entry


SENTENCES = [
    "The cat sat on the mat.",
    "hello world",
    "Dogs, a cat, hello. The world!",
    "Été ünïcode — naïve café 東京",
]


def test_ids_are_those_of_the_tokenizer_file_itself(tokenizer_file: Path) -> None:
    enc = TextEncoder(tokenizer_file, max_len=128)
    ref = _reference(tokenizer_file, 128)
    (ids, mask), (ids2, _) = (
        _ok(e) for e in enc.encode_batch([_texts(*(s.encode() for s in SENTENCES)), _texts(b"a")])
    )
    assert ids.dtype == mask.dtype == np.int64
    for row, s in enumerate(SENTENCES):
        want = ref.encode(s).ids
        assert ids[row, : len(want)].tolist() == want
        assert mask[row].tolist() == [1] * len(want) + [0] * (ids.shape[1] - len(want))
    assert ids2[0].tolist() == ref.encode("a").ids


def test_each_request_is_padded_to_its_own_longest_item_only(small: Path) -> None:
    enc = TextEncoder(small, max_len=64)
    short, long_ = _texts(b"hello", b"the cat sat on the mat"), _texts(b"a dog")
    (ids, mask), (ids2, mask2) = (_ok(e) for e in enc.encode_batch([short, long_]))
    # the file pads to 16 by itself: that padding is gone, each request is as long as its longest item
    assert ids.shape == mask.shape == (2, 8)
    assert ids[0].tolist() == [CLS, VOCAB.index("hello"), SEP, 0, 0, 0, 0, 0]
    assert mask.tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1] * 8]
    assert ids2.shape == (1, 4) and mask2.tolist() == [[1, 1, 1, 1]]


def test_a_long_text_is_truncated_to_max_len_with_sep_last(tokenizer_file: Path) -> None:
    enc = TextEncoder(tokenizer_file, max_len=10)
    ids, mask = _ok(enc.encode_batch([_texts(" ".join(["the cat sat on the mat"] * 50).encode())])[0])
    assert ids.shape == (1, 10) and mask.sum() == 10
    ref = _reference(tokenizer_file, 512)
    assert ids[0, 0] == ref.token_to_id("[CLS]") and ids[0, -1] == ref.token_to_id("[SEP]")
    assert ids[0].tolist() == _reference(tokenizer_file, 10).encode(" ".join(["the cat sat on the mat"] * 50)).ids


def test_a_bad_request_fails_alone(small: Path) -> None:
    enc = TextEncoder(small, max_len=32, max_bytes=100)
    requests = [
        _texts(b"hello world", b"the cat"),
        _texts(b"hello", b"caf\xe9 latin-1"),
        _texts(b"hello", "   \t\n"),
        _texts(b"x" * 101),
        np.array([[1, 2, 3]], dtype=np.int64),
        _texts(b"the mat", 7),
        np.empty((0, 1), dtype=object),
        _texts(b"a dog"),
    ]
    out = enc.encode_batch(requests)
    assert len(out) == len(requests)
    assert _ok(out[0])[0].shape == (2, 4)
    assert _ok(out[-1])[0].tolist() == [[CLS, VOCAB.index("a"), VOCAB.index("dog"), SEP]]
    kinds = [e.reason if isinstance(e, ValidationError) else None for e in out]
    assert kinds == [
        None,
        "text_not_utf8",
        "text_empty",
        "text_too_long",
        "text_dtype",
        "text_dtype",
        "empty_batch",
        None,
    ]
    messages = [str(e) for e in out[1:7]]
    assert "'text' item 1 is not valid UTF-8" in messages[0] and "encode the text as UTF-8" in messages[0]
    assert "'text' item 1 is empty or whitespace only" in messages[1]
    assert "item 0 holds 101 bytes" in messages[2] and "limit of 100" in messages[2] and "split" in messages[2]
    assert "datatype int64" in messages[3] and "send the text input as BYTES of shape [n, 1]" in messages[3]
    assert "item 1 is a int" in messages[4] and "BYTES of shape [n, 1]" in messages[4]
    assert "batch dimension is 0" in messages[5]


def test_str_items_and_flat_arrays_are_accepted(small: Path) -> None:
    enc = TextEncoder(small, max_len=32, max_bytes=8)
    want = _ok(enc.encode_batch([_texts(b"hello", "é".encode())])[0])
    for a in (_texts("hello", "é"), np.array(["hello", "é"]), np.array([b"hello", "é".encode()], dtype=object)):
        got = _ok(enc.encode_batch([a])[0])
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    # the byte limit counts UTF-8 bytes of str items too; a lone surrogate is not UTF-8
    too_long, surrogate = enc.encode_batch([_texts("é" * 5), _texts("ok\ud800")])
    assert isinstance(too_long, ValidationError) and too_long.reason == "text_too_long"
    assert isinstance(surrogate, ValidationError) and surrogate.reason == "text_not_utf8"


def test_a_wrong_shape_is_refused(small: Path) -> None:
    (err,) = TextEncoder(small, max_len=8).encode_batch([np.array([[b"a", b"b"]], dtype=object)])
    assert isinstance(err, ValidationError) and err.reason == "text_dtype"
    assert "shape [1, 2]" in str(err)


def test_an_item_with_no_tokens_is_refused(tmp_path: Path) -> None:
    # without a post-processor, text the normalizer removes entirely would be a row of length 0
    enc = TextEncoder(_small_tokenizer(tmp_path / "t.json", post_processor=False), max_len=8)
    err, ok = enc.encode_batch([_texts(b"hello", b"\x01\x02"), _texts(b"hello")])
    assert isinstance(err, ValidationError) and err.reason == "text_empty" and "item 1" in str(err)
    assert _ok(ok)[0].tolist() == [[VOCAB.index("hello")]]


def test_the_encoder_tells_what_it_loaded(small: Path) -> None:
    enc = TextEncoder(small, max_len=12)
    assert enc.tokenizer_path == small and enc.max_len == 12 and enc.max_bytes == DEFAULT_MAX_TEXT_BYTES
    assert enc.vocab_size == len(VOCAB)
    assert enc.describe() == (
        f"text tokenizer {small} (vocab {len(VOCAB)}, max_len 12 tokens, max_bytes 65536; "
        "word cache: up to 65536 chunks)"
    )


def test_minilm_has_its_vocabulary(minilm: Path) -> None:
    enc = TextEncoder(minilm, max_len=128)
    assert enc.vocab_size == 30522
    ids, _ = _ok(enc.encode_batch([_texts(b"hello world")])[0])
    assert ids.tolist() == [[101, 7592, 2088, 102]]


def test_a_missing_or_unreadable_tokenizer_file_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="pip install tokenizers")
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(ConfigError, match=rf"tokenizer file '{missing}' does not exist.*tokenizer.json"):
        TextEncoder(missing, max_len=128)
    garbage = tmp_path / "tokenizer.json"
    garbage.write_text("{not json")
    with pytest.raises(ConfigError, match=rf"cannot load tokenizer file '{garbage}'.*Hugging Face tokenizer.json"):
        TextEncoder(garbage, max_len=128)


def test_bad_limits_are_config_errors(small: Path) -> None:
    with pytest.raises(ConfigError, match=r"max_len is 1; it must be at least 2"):
        TextEncoder(small, max_len=1)
    with pytest.raises(ConfigError, match=r"max_bytes is 0"):
        TextEncoder(small, max_len=8, max_bytes=0)


def test_without_tokenizers_installed_the_error_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install tokenizers"):
        TextEncoder(tmp_path / "tokenizer.json", max_len=128)


def test_the_module_imports_tokenizers_only_when_an_encoder_is_built() -> None:
    tree = ast.parse(Path(text_module.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.startswith(("tokenizers", "triton_python_backend_utils"))], names


@pytest.mark.parametrize("word_cache", [0, 64])
def test_a_request_that_breaks_the_tokenizer_fails_alone(small: Path, word_cache: int) -> None:
    # a control character sends the text to the library with or without the word cache
    enc = TextEncoder(small, max_len=16, word_cache=word_cache)
    real = enc._encode

    def breaks(texts: list[str], add_special_tokens: bool) -> Any:
        """The real tokenizer, except that it raises on any batch holding 'boom'."""
        if any("boom" in t for t in texts):
            raise Exception("boom")
        return real(texts, add_special_tokens=add_special_tokens)

    enc._encode = breaks
    ok, bad, ok2 = enc.encode_batch([_texts(b"hello"), _texts(b"a boom\x07"), _texts(b"the cat")])
    assert isinstance(bad, ValidationError) and bad.reason == "text_tokenize"
    assert _ok(ok)[0].tolist() == [[CLS, VOCAB.index("hello"), SEP]]
    assert _ok(ok2)[0].shape == (1, 4)
