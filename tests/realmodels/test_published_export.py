"""Export to the published layouts: load -> export -> load is bit for
bit for EAGLE-1/2, EAGLE-3 and Medusa checkpoints (also after online updates);
specloop's own full-vocabulary Medusa heads export to identical logits; heads that do
not convert exactly are refused with the reason (API and ``specloop draft export``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specloop.cli import main
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle_drafter import EagleDrafter
from specloop.realmodels.heads.common import ReducedVocab
from specloop.realmodels.heads.head_drafting import MedusaDrafter
from specloop.realmodels.heads.medusa import build_medusa
from specloop.realmodels.heads.published_export import export_published, vllm_notes
from tests.realmodels.test_published_heads import H, V, VD, _target, write_eagle, write_eagle3, write_medusa


@pytest.fixture(scope="module")
def tiny():
    return _target()


def _state(drafter) -> dict[str, torch.Tensor]:
    inner = getattr(drafter, "head", None) or drafter.heads
    return {k: v for k, v in inner.state_dict().items()}


def _assert_same_drafter(a, b):
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    for name in ("embed_weight", "lm_head"):
        head_a, head_b = getattr(a, "head", None), getattr(b, "head", None)
        if head_a is not None:
            assert torch.equal(getattr(head_a, name), getattr(head_b, name)), name
    if hasattr(a, "head"):
        assert torch.equal(a.vocab.d2t, b.vocab.d2t) and a.head.config == b.head.config


@pytest.mark.parametrize("kind,writer,options", [
    ("eagle", write_eagle, {}), ("eagle", write_eagle, {"bias": False}), ("eagle3", write_eagle3, {}),
    ("medusa", write_medusa, {"layers": 2})])
def test_load_export_load_is_bit_for_bit(tiny, tmp_path, kind, writer, options):
    written = writer(tmp_path / "src", **options)
    first = make_drafter(f"{kind}:{tmp_path / 'src'}", tiny)
    export_published(first, kind, tmp_path / "out", tiny)
    second = make_drafter(f"{kind}:{tmp_path / 'out'}", tiny)
    _assert_same_drafter(first, second)
    if kind == "medusa":
        exported = torch.load(tmp_path / "out" / "medusa_lm_head.pt", weights_only=True)
    else:
        exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert exported.keys() == written.keys()          # the published key layout, nothing more
    for key in written:
        assert torch.equal(exported[key], written[key]), key


def test_own_embedding_is_written_only_when_it_differs(tiny, tmp_path):
    own = torch.randn(V, H, generator=torch.Generator().manual_seed(3))
    t = write_eagle(tmp_path / "src")
    from safetensors.torch import save_file
    save_file({**t, "embed_tokens.weight": own}, str(tmp_path / "src" / "model.safetensors"))
    first = make_drafter(f"eagle:{tmp_path / 'src'}", tiny)
    export_published(first, "eagle", tmp_path / "out", tiny)
    assert torch.equal(load_file(str(tmp_path / "out" / "model.safetensors"))["embed_tokens.weight"], own)
    _assert_same_drafter(first, make_drafter(f"eagle:{tmp_path / 'out'}", tiny))


def test_online_trained_head_exports_its_trained_tensors(tiny, tmp_path):
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
    from specloop.realmodels.policy import FixedDraftPolicy
    write_eagle3(tmp_path / "src")
    inner = make_drafter(f"eagle3:{tmp_path / 'src'}", tiny)
    before = {k: v.clone() for k, v in _state(inner).items()}
    drafter = OnlineDrafter(inner, OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05, batch_size=4)))
    SpeculativeDecoder(tiny, drafter, policy=FixedDraftPolicy(3), eos_token_id=-1).generate([5, 17, 33, 9],
                                                                                           max_new_tokens=12)
    assert any(not torch.equal(before[k], v) for k, v in _state(inner).items())
    export_published(drafter, "eagle3", tmp_path / "out", tiny)
    _assert_same_drafter(inner, make_drafter(f"eagle3:{tmp_path / 'out'}", tiny))


def _specloop_medusa(tiny, layers, *, vocab=None, tied=True):
    gen = torch.Generator().manual_seed(11)
    d2t = torch.randperm(V, generator=gen) if vocab is None else vocab
    heads = build_medusa(tiny.model, d2t, num_heads=3, num_layers=layers)
    with torch.no_grad():
        for k, head in enumerate(heads.heads):
            w, b = torch.randn(H, H, generator=gen) * 0.2, torch.randn(H, generator=gen) * 0.1
            for block in head:
                block.linear.weight.copy_(w if tied else torch.randn(H, H, generator=gen) * 0.2)
                block.linear.bias.copy_(b)
        heads.lm_head.proj.weight.add_(torch.randn(heads.lm_head.proj.weight.shape, generator=gen) * 0.1)
    return MedusaDrafter(heads.eval())


@pytest.mark.parametrize("layers", [1, 2])
def test_specloop_full_vocabulary_medusa_exports_to_identical_logits(tiny, tmp_path, layers):
    ours = _specloop_medusa(tiny, layers)
    export_published(ours, "medusa", tmp_path / "m", tiny)
    loaded = make_drafter(f"medusa:{tmp_path / 'm'}", tiny)
    h = torch.randn(4, H, generator=torch.Generator().manual_seed(2))
    d2t = ours.heads.lm_head.draft_to_target
    with torch.no_grad():
        for k in range(3):
            mine = ours.heads.head_logits(h, k)                      # (4, V) in draft order
            theirs = loaded.heads.head_logits(h, k)[:, d2t]          # (4, V) target order -> draft order
            torch.testing.assert_close(theirs, mine, atol=1e-6, rtol=1e-6)
            assert torch.equal(theirs.argmax(-1), mine.argmax(-1))


def test_heads_that_do_not_convert_exactly_are_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match="reduced vocabulary of 160 of 256 tokens.*--vocab-size 256"):
        export_published(_specloop_medusa(tiny, 1, vocab=torch.arange(VD)), "medusa", tmp_path / "a", tiny)
    with pytest.raises(ValueError, match="head 0 has 2 different residual blocks.*tied block"):
        export_published(_specloop_medusa(tiny, 2, tied=False), "medusa", tmp_path / "b", tiny)
    for kind, match in (("eagle", "RMS-normalises the embedding and feature halves"), ("eagle3", "fuse layer")):
        cfg = EagleConfig.from_target(tiny.model.config, kind, VD)
        head = EagleHead(cfg, tiny.model.get_input_embeddings().weight, tiny.model.lm_head.weight[:VD])
        drafter = EagleDrafter(head, ReducedVocab(torch.arange(VD), V), name=kind)
        with pytest.raises(ValueError, match=match):
            export_published(drafter, kind, tmp_path / kind, tiny)
    write_eagle3(tmp_path / "e3")
    with pytest.raises(ValueError, match="an eagle3 head cannot be written in the medusa format"):
        export_published(make_drafter(f"eagle3:{tmp_path / 'e3'}", tiny), "medusa", tmp_path / "c", tiny)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()     # nothing written on refusal


def test_cli_export_refuses_with_exit_2(capsys, tmp_path):
    assert main(["draft", "export", "--kind", "hydra", "--format", "medusa", "--out", str(tmp_path)]) == 2
    assert "--kind must be eagle, eagle3, medusa or KIND:PATH" in capsys.readouterr().err
    code = main(["draft", "export", "--target", "smollm2-135m", "--kind", "eagle3", "--format", "eagle3",
                 "--out", str(tmp_path / "x")])
    assert code == 2 and "cannot be written as EAGLE-3 exactly" in capsys.readouterr().err


# ----------------------------------------------------------------- vLLM layouts (vllm_notes, VLLM_COMMIT)
def _vllm_medusa_reference(folder):
    """vLLM's Medusa written from its code at VLLM_COMMIT (configs/medusa.py ``from_pretrained``,
    models/medusa.py ``load_weights`` / ``forward`` / ``compute_logits``) in plain torch:
    returns f(h [B, H], k) -> [B, V] logits (-inf off ``token_map``). Every vLLM parameter
    must be in the file (vLLM would leave a missing one uninitialised) and nothing else."""
    import json
    cfg = json.loads((folder / "config.json").read_text())
    for key in list(cfg):                           # MedusaConfig.from_pretrained's renaming
        if "num" in key and "heads" in key:
            cfg["num_heads"] = cfg.pop(key)
        elif "num" in key and "layers" in key:
            cfg["num_hidden_layers"] = cfg.pop(key)
    assert cfg["model_type"] == "medusa" and cfg.get("architectures", ["MedusaModel"]) == ["MedusaModel"]
    heads, layers, vocab = cfg["num_heads"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kept = cfg.get("truncated_vocab_size") or vocab
    weights = {k.replace("medusa_heads.", ""): v for k, v in load_file(str(folder / "model.safetensors")).items()}
    token_map = weights.pop("token_map") if kept < vocab else None
    params = {f"blocks.{k}.layers.{l}.weight" for k in range(heads) for l in range(layers)}
    if cfg.get("medusa_fc_bias", False):
        params |= {f"blocks.{k}.layers.{l}.bias" for k in range(heads) for l in range(layers)}
    params |= {f"lm_heads.{k}.weight" for k in range(heads)}
    assert set(weights) == params
    assert kept == vocab or token_map is not None

    def logits(h, k):
        x = h
        for l in range(layers):
            b = weights.get(f"blocks.{k}.layers.{l}.bias")
            x = x + F.silu(F.linear(x, weights[f"blocks.{k}.layers.{l}.weight"], b))
        lm = weights[f"lm_heads.{k}.weight"]
        if token_map is not None and lm.shape[0] > token_map.shape[0]:
            lm = lm[token_map]
        assert lm.shape == (kept, h.shape[-1])
        out = F.linear(x, lm)
        if token_map is None:
            return out
        full = torch.full((*out.shape[:-1], vocab), -torch.inf)
        full[..., token_map] = out
        return full
    return logits


def _target_logits(drafter, h, k):
    """specloop's head k on h as [B, V] target-vocabulary logits (-inf off the draft vocabulary)."""
    heads = drafter.heads
    mine = heads.head_logits(h, k)
    full = torch.full((h.shape[0], heads.config.target_vocab_size), -torch.inf)
    full[:, heads.lm_head.draft_to_target] = mine
    return full


@pytest.mark.parametrize("case", ["reduced-untied", "full-permuted", "published-tied"])
def test_vllm_medusa_export_gives_specloop_logits_under_vllm_reader(tiny, tmp_path, case):
    if case == "reduced-untied":        # both refused by the reference layout, exact in vLLM's
        drafter = _specloop_medusa(tiny, 2, vocab=torch.randperm(V, generator=torch.Generator().manual_seed(5))[:VD],
                                   tied=False)
    elif case == "full-permuted":
        drafter = _specloop_medusa(tiny, 1)
    else:
        write_medusa(tmp_path / "src", layers=2)
        drafter = make_drafter(f"medusa:{tmp_path / 'src'}", tiny)
    export_published(drafter, "vllm-medusa", tmp_path / "v", tiny)
    reference = _vllm_medusa_reference(tmp_path / "v")
    h = torch.randn(5, H, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        for k in range(3):
            theirs, mine = reference(h, k), _target_logits(drafter, h, k)
            torch.testing.assert_close(theirs, mine, atol=1e-6, rtol=1e-6)
            assert torch.equal(theirs.argmax(-1), mine.argmax(-1))
    assert (("token_map" in load_file(str(tmp_path / "v" / "model.safetensors"))) == (case == "reduced-untied"))
    assert vllm_notes(tmp_path / "v", "vllm-medusa") == []


def test_reference_medusa_layout_is_named_as_not_vllms(tiny, tmp_path):
    export_published(_specloop_medusa(tiny, 1), "medusa", tmp_path / "m", tiny)
    assert "--format vllm-medusa" in vllm_notes(tmp_path / "m", "medusa")[0]
    with pytest.raises(ValueError, match="export as vllm-medusa"):
        export_published(_specloop_medusa(tiny, 2, tied=False), "medusa", tmp_path / "b", tiny)


# vLLM's parameter names at VLLM_COMMIT (llama_eagle.py / llama_eagle3.py load_weights), as
# checkpoint keys: the exported names must be exactly these (plus d2t/t2d for EAGLE-3).
_LAYER = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
          "post_attention_layernorm.weight")
_VLLM_EAGLE = {"fc.weight", *(f"layers.0.{n}" for n in _LAYER)}
_VLLM_EAGLE3 = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                *(f"midlayer.{n}" for n in _LAYER + ("input_layernorm.weight", "hidden_norm.weight"))}


@pytest.mark.parametrize("kind,writer,options,names", [
    ("eagle", write_eagle, {"bias": False}, _VLLM_EAGLE), ("eagle3", write_eagle3, {}, _VLLM_EAGLE3)])
def test_eagle_exports_carry_vllms_names_and_config_ids(tiny, tmp_path, kind, writer, options, names):
    import json
    writer(tmp_path / "src", **options)
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    cfg.pop("architectures", None)                   # a source config without the ids vLLM reads
    (tmp_path / "src" / "config.json").write_text(json.dumps(cfg))
    export_published(make_drafter(f"{kind}:{tmp_path / 'src'}", tiny), kind, tmp_path / "out", tiny)
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == names
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "llama" and written["architectures"] == ["LlamaForCausalLM"]
    assert kind == "eagle" or written["draft_vocab_size"] == VD
    assert vllm_notes(tmp_path / "out", kind) == []


def test_vllm_notes_name_what_vllm_would_not_run_exactly(tiny, tmp_path):
    write_eagle(tmp_path / "src")                                        # fc with a bias
    export_published(make_drafter(f"eagle:{tmp_path / 'src'}", tiny), "eagle", tmp_path / "out", tiny)
    notes = vllm_notes(tmp_path / "out", "eagle")
    assert len(notes) == 1 and "fc without a bias" in notes[0]
    own = torch.randn(V, H, generator=torch.Generator().manual_seed(3))
    from safetensors.torch import save_file
    save_file({**write_eagle3(tmp_path / "e3"), "embed_tokens.weight": own}, str(tmp_path / "e3" / "model.safetensors"))
    export_published(make_drafter(f"eagle3:{tmp_path / 'e3'}", tiny), "eagle3", tmp_path / "o3", tiny)
    assert any("target's embeddings" in n for n in vllm_notes(tmp_path / "o3", "eagle3"))


def test_cli_accepts_the_vllm_medusa_format(capsys, tmp_path):
    assert main(["draft", "export", "--kind", "hydra", "--format", "vllm-medusa", "--out", str(tmp_path)]) == 2
    assert "--kind must be eagle, eagle3, medusa or KIND:PATH" in capsys.readouterr().err
