"""Our tokenizer as bytes (what outlines-core's Vocabulary is built from), and the caches."""

from __future__ import annotations

import pickle

from constrained.helpers import EOS, VOCAB, make_compiler, tokenizer

from radixlm.runtime.constrained import GrammarSpec
from radixlm.runtime.constrained.cache import DiskCache, LRUCache
from radixlm.runtime.constrained.vocab import TokenVocab


def test_token_bytes_match_the_tokenizer():
    tok = tokenizer()
    vocab = TokenVocab.from_tokenizer(tok, VOCAB, (EOS,))
    special = set(tok.added_tokens_decoder)
    assert all(vocab.token_bytes[t] is None for t in special | {EOS})
    for tid in range(0, VOCAB, 7):
        tb = vocab.token_bytes[tid]
        if tb is not None:
            assert tb.decode("utf-8", errors="replace") == tok.decode([tid])
    for text in ['{"name": "Zoë"}', "日本語 text\n\t", "x = 12345"]:
        assert vocab.decode_bytes(tok.encode(text, add_special_tokens=False)).decode() == text
    assert len(vocab.byte_token) > 200  # nearly every byte has a one-byte token
    assert TokenVocab.from_tokenizer(tok, VOCAB, (EOS,)).fingerprint == vocab.fingerprint
    assert TokenVocab.from_tokenizer(tok, VOCAB, (EOS, 0)).fingerprint != vocab.fingerprint


def test_model_vocab_larger_than_tokenizer():
    """Mask rows are as wide as the model's vocab; ids past the tokenizer's are never allowed."""
    import torch

    from radixlm.runtime.constrained.outlines_backend import OutlinesCompiler

    compiler = OutlinesCompiler(tokenizer(), VOCAB + 100, (EOS,))
    grammar = compiler.compile(GrammarSpec("regex", "[a-z]{1,3}"))
    row = torch.full(((VOCAB + 100 + 31) // 32,), -1, dtype=torch.int32)
    grammar.fill_mask(row)
    assert (row[VOCAB // 32 :] == 0).all() and (row != 0).any()


def test_lru_and_disk_cache(tmp_path):
    lru: LRUCache[str, int] = LRUCache(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1
    lru.put("c", 3)  # evicts b, the least recently used
    assert lru.get("b") is None and lru.get("a") == 1 and len(lru) == 2
    disk = DiskCache(str(tmp_path))
    disk.store(("k", 1), {"x": 1})
    assert disk.load(("k", 1)) == {"x": 1} and disk.load(("k", 2)) is None
    with open(disk.path(("bad",)), "wb") as f:
        f.write(b"not a pickle")
    assert disk.load(("bad",)) is None
    with open(disk.path(("other",)), "wb") as f:  # a hash collision / foreign entry
        pickle.dump(("something else", 1), f)
    assert disk.load(("other",)) is None


def test_compiler_disk_cache_roundtrip(tmp_path):
    spec = GrammarSpec("regex", "(yes|no)")
    first = make_compiler(str(tmp_path))
    first.compile(spec)
    assert first.stats["compiled"] == 1
    second = make_compiler(str(tmp_path))
    grammar = second.compile(spec)
    assert second.stats == {**second.stats, "compiled": 0, "disk_hits": 1}
    assert grammar.accept(tokenizer().encode("yes", add_special_tokens=False)[0])
    assert grammar.is_terminated()
    second.compile(spec)
    assert second.stats["memory_hits"] == 1
