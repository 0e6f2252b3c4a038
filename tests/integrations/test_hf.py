"""transformers ``generate(custom_generate=speculative_generate)`` :
greedy output identical to HF greedy on a tiny Llama (n-gram and a published EAGLE-3
head) and on SmolLM2-135M; EOS, streamer, return_dict, GenerationConfig sampling
settings honoured; unsupported settings refused with the setting named."""
from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from specloop.integrations.hf import sampling_from_generation_config, speculative_generate
from specloop.realmodels.sampling import SamplingConfig
from tests.realmodels.test_published_heads import IDS, _target, write_eagle3

PROMPTS = [[7, 8, 9, 7, 8, 9, 7], IDS, [3, 4, 5, 6, 3, 4]]


@pytest.fixture(scope="module")
def tiny():
    return _target()


def _hf(model, prompt, **kw):
    return model.generate(torch.tensor([prompt]), do_sample=False, **kw)


class Recorder:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


def test_greedy_equals_hf_greedy_with_ngram_and_a_published_head(tiny, tmp_path):
    write_eagle3(tmp_path / "e3")
    for prompt in PROMPTS:
        want = _hf(tiny.model, prompt, max_new_tokens=16, eos_token_id=None)
        for drafter in ("ngram", f"eagle3:{tmp_path / 'e3'}"):
            got = _hf(tiny.model, prompt, max_new_tokens=16, eos_token_id=None,
                      custom_generate=speculative_generate, drafter=drafter, num_draft_tokens=3)
            assert torch.equal(got, want), (prompt, drafter)


def test_eos_streamer_and_return_dict(tiny):
    free = _hf(tiny.model, IDS, max_new_tokens=20, eos_token_id=None)[0, len(IDS):].tolist()
    eos = free[6]
    want = _hf(tiny.model, IDS, max_new_tokens=20, eos_token_id=eos)
    rec = Recorder()
    got = _hf(tiny.model, IDS, max_new_tokens=20, eos_token_id=eos, custom_generate=speculative_generate,
              streamer=rec, return_dict_in_generate=True)
    assert torch.equal(got.sequences, want) and got.sequences[0, -1] == eos
    assert rec.puts[0] == IDS and sum(rec.puts[1:], []) == got.sequences[0, len(IDS):].tolist()
    assert rec.ended == 1


def test_sampling_settings_map_and_sampling_is_repeatable(tiny):
    cfg = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9)
    assert sampling_from_generation_config(cfg) == SamplingConfig(0.7, 20, 0.9)
    assert sampling_from_generation_config(GenerationConfig(do_sample=False, temperature=0.7)) == SamplingConfig()
    assert sampling_from_generation_config(GenerationConfig(do_sample=True, top_k=0, top_p=1.0)) == \
        SamplingConfig(1.0, None, None)
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(tiny.model.generate(torch.tensor([IDS]), do_sample=True, temperature=0.7, top_k=20,
                                        max_new_tokens=15, eos_token_id=None, custom_generate=speculative_generate))
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == (1, len(IDS) + 15)
    # top_k=1 sampling is greedy: the warpers really reach the decoder
    one = tiny.model.generate(torch.tensor([IDS]), do_sample=True, top_k=1, max_new_tokens=10, eos_token_id=None,
                              custom_generate=speculative_generate)
    assert torch.equal(one, _hf(tiny.model, IDS, max_new_tokens=10, eos_token_id=None))


@pytest.mark.parametrize("kwargs,match", [
    ({"num_beams": 2}, "beam search"), ({"repetition_penalty": 1.3}, "RepetitionPenaltyLogitsProcessor"),
    ({"min_new_tokens": 3}, "MinNewTokensLengthLogitsProcessor"), ({"output_scores": True,
                                                                    "return_dict_in_generate": True}, "scores"),
    ({"do_sample": True, "min_p": 0.1}, "min_p"), ({"max_time": 5.0}, "MaxTimeCriteria")])
def test_unsupported_settings_are_refused(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny.model.generate(torch.tensor([IDS]), max_new_tokens=5, custom_generate=speculative_generate, **kwargs)


def test_batches_and_padding_are_refused(tiny):
    with pytest.raises(ValueError, match="batch > 1"):
        tiny.model.generate(torch.tensor([IDS[:4], IDS[4:8]]), max_new_tokens=5, custom_generate=speculative_generate)
    with pytest.raises(ValueError, match="padded inputs"):
        tiny.model.generate(torch.tensor([IDS[:4]]), attention_mask=torch.tensor([[0, 1, 1, 1]]), max_new_tokens=5,
                            custom_generate=speculative_generate)


def test_smollm2_greedy_equals_hf_greedy():
    from specloop.realmodels.loading import load_model
    loaded = load_model("smollm2-135m", dtype="float32")
    for text, drafter in (("def fibonacci(n):\n    ", "ngram"), ("The capital of France is", "suffix")):
        ids = loaded.tokenizer(text, return_tensors="pt").input_ids
        want = loaded.model.generate(ids, do_sample=False, max_new_tokens=12)
        got = loaded.model.generate(ids, do_sample=False, max_new_tokens=12, custom_generate=speculative_generate,
                                    drafter=drafter)
        assert torch.equal(got, want), (text, drafter)


@pytest.mark.parametrize("drafter,target_name,command", [
    ("eagle3", None, "specloop draft train --target"), ("hydra", None, "specloop draft train --target"),
    ("ngram-datastore", "smollm2-135m", "specloop draft datastore --target smollm2-135m")])
def test_a_missing_head_or_index_is_one_line_and_nothing_is_trained(tiny, tmp_path, monkeypatch, drafter,
                                                                     target_name, command):
    import specloop.integrations.hf as hf
    import specloop.realmodels.registry.datastore as datastore
    import specloop.realmodels.training.trainer as trainer

    def refuse(*args, **kwargs):
        raise AssertionError("training or index building started inside generate")

    monkeypatch.setenv("SPECLOOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(trainer, "get_trainer", refuse)
    monkeypatch.setattr(datastore, "_warmup_stream", refuse)
    monkeypatch.setattr(hf, "_DRAFTERS", type(hf._DRAFTERS)())
    monkeypatch.setattr(tiny.model, "name_or_path", str(tmp_path / "hub" / "models--x" / "snapshots" / "abc"))
    extra = {} if target_name is None else {"target_name": target_name}
    with pytest.raises(FileNotFoundError) as err:
        _hf(tiny.model, IDS, max_new_tokens=4, custom_generate=speculative_generate, drafter=drafter, **extra)
    text = str(err.value)
    assert "\n" not in text and command in text and err.value.__cause__ is None
    assert ("pass target_name=" in text) == (target_name is None)
    assert not (tmp_path / "cache" / "datastore").exists()


def test_the_tokenizer_reaches_the_drafters_target(tiny, monkeypatch):
    import specloop.integrations.hf as hf
    seen = {}
    real = hf._drafter_for

    def spy(model, drafter, options, target, named):
        seen["tokenizer"] = target.tokenizer
        return real(model, drafter, options, target, named)

    monkeypatch.setattr(hf, "_drafter_for", spy)
    token = object()
    _hf(tiny.model, IDS, max_new_tokens=4, custom_generate=speculative_generate, drafter="ngram",
        drafter_options={"tokenizer": token})
    assert seen["tokenizer"] is token
    speculative_generate(tiny.model, torch.tensor([IDS]), generation_config=GenerationConfig(max_new_tokens=2),
                         drafter="ngram", tokenizer="tok")
    assert seen["tokenizer"] == "tok"
