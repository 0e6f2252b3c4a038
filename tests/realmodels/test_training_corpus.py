"""Warm-up corpus and feature cache: determinism, the validation slice, resumable
extraction that matches a one-shot forward, and clear errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specloop.realmodels.training.corpus import (Document, build_corpus, load_corpus, save_corpus,
                                                 strip_roff)
from specloop.realmodels.training.features import (chunk_stream, create_part, eagle3_layers,
                                                   extract_features, open_part)


class _CharTokenizer:
    """Bytes as token ids, EOS = 0."""
    eos_token_id = 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [b % 250 + 1 for b in text.encode("utf-8")]}


def _docs():
    return {src: [Document(f"{src}:{i}", src, f"{src} document number {i} " * (5 + i % 7)) for i in range(120)]
            for src in ("stdlib", "docs", "man", "prompts")}


def test_corpus_is_deterministic_mixed_and_holds_out_by_id(tmp_path):
    tok = _CharTokenizer()
    a = build_corpus(tok, 20_000, documents=_docs())
    b = build_corpus(tok, 20_000, documents=_docs())
    assert a.fingerprint == b.fingerprint and np.array_equal(a.train_ids, b.train_ids)
    by_source = a.tokens_by_source("train")
    assert set(by_source) == {"stdlib", "docs", "man", "prompts"}
    assert 0.3 < by_source["stdlib"] / sum(by_source.values()) < 0.6
    val_ids = {d["id"] for d in a.docs if d["split"] == "val"}
    assert val_ids and all(Document(i, "x", "").is_validation for i in val_ids)
    bigger = build_corpus(tok, 40_000, documents=_docs())
    assert val_ids <= {d["id"] for d in bigger.docs if d["split"] == "val"} | val_ids
    assert not val_ids & {d["id"] for d in bigger.docs if d["split"] == "train"}
    save_corpus(a, tmp_path)
    again = load_corpus(tmp_path)
    assert again.fingerprint == a.fingerprint and np.array_equal(again.val_ids, a.val_ids)
    assert again.requested_tokens == 20_000
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "missing")
    with pytest.raises(ValueError):
        build_corpus(tok, 0, documents=_docs())


def test_strip_roff_keeps_prose():
    text = '.\\" comment\n.TH LS 1\n.SH NAME\nls \\- list \\fBdirectory\\fR contents\n.B \\-a\n'
    assert strip_roff(text) == "NAME\nls - list directory contents\n-a"


def _tiny_model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


def test_feature_cache_resumes_and_matches_a_direct_forward(tmp_path):
    model = _tiny_model()
    chunks = chunk_stream(np.arange(6 * 16) % 64, 16)
    layers = (*eagle3_layers(6), -1)
    part = create_part(tmp_path / "p", chunks, layers=layers, hidden_size=16, top_k=4, target="t",
                       fingerprint="f")
    extract_features(model, part, max_chunks=3, flush_every=1, progress=False)
    assert open_part(tmp_path / "p").n_done == 3
    again = create_part(tmp_path / "p", chunks, layers=layers, hidden_size=16, top_k=4, target="t",
                        fingerprint="f")
    extract_features(model, again, batch_size=2, progress=False)
    assert again.n_done == 6
    with torch.no_grad():
        out = model(torch.from_numpy(chunks[4:5].astype(np.int64)), output_hidden_states=True)
    for layer in layers:
        np.testing.assert_allclose(again.hidden(layer)[4], out.hidden_states[layer][0].numpy(), atol=2e-3, rtol=2e-3)
    probs = torch.softmax(out.logits[0], -1)
    top = torch.topk(probs, 4, -1)
    assert np.array_equal(again.array("topk_ids")[4], top.indices.numpy())
    np.testing.assert_allclose(again.array("topk_probs")[4], top.values.numpy(), atol=1e-3)
    with pytest.raises(ValueError, match="other data"):
        create_part(tmp_path / "p", chunks, layers=layers, hidden_size=16, top_k=4, target="t", fingerprint="g")
    with pytest.raises(ValueError):
        again.hidden(1)
    with pytest.raises(FileNotFoundError):
        open_part(tmp_path / "none")
    with pytest.raises(ValueError):
        chunk_stream(np.arange(5), 16)


def test_corpus_mix_parses_selects_sources_and_names_its_cache(tmp_path):
    from specloop.realmodels.training.corpus import DEFAULT_MIX, mix_tag, parse_mix
    from specloop.realmodels.training.features import features_root, training_features_root
    from specloop.realmodels.training.trainer import TrainConfig
    mix = parse_mix("stdlib=0.6, docs=0.2,man=0.2")
    assert mix == {"stdlib": 0.6, "docs": 0.2, "man": 0.2}
    for bad, msg in (("web=1", "unknown corpus source"), ("stdlib", "source=weight"), ("stdlib=-1", ">= 0"),
                     ("stdlib=0", "no positive"), ("stdlib=1,stdlib=2", "twice"), ("stdlib=nan", "finite"),
                     ("stdlib=x", "not a number")):
        with pytest.raises(ValueError, match=msg):
            parse_mix(bad)
    # the tag is stable under scaling, empty for the default mix, and differs between mixes
    assert mix_tag(mix) == mix_tag({"stdlib": 6, "docs": 2, "man": 2}) == "mix-docs20-man20-stdlib60"
    assert mix_tag(None) == mix_tag(dict(DEFAULT_MIX)) == ""
    assert mix_tag({"stdlib": 1}) != mix_tag(mix)
    corpus = build_corpus(_CharTokenizer(), 20_000, mix=mix, documents=_docs())
    assert set(corpus.tokens_by_source("train")) == {"stdlib", "docs", "man"}
    save_corpus(corpus, tmp_path / "c")
    assert load_corpus(tmp_path / "c").mix == corpus.mix == {"docs": 0.2, "man": 0.2, "stdlib": 0.6}
    assert training_features_root(TrainConfig(corpus_mix=mix)) == features_root("smollm2-135m-mix-docs20-man20-stdlib60")
    assert training_features_root(TrainConfig()) == features_root("smollm2-135m")
    assert training_features_root(TrainConfig(corpus_mix=mix, feature_root=str(tmp_path))) == tmp_path
    with pytest.raises(ValueError, match="unknown corpus source"):
        TrainConfig(corpus_mix={"web": 1.0})
