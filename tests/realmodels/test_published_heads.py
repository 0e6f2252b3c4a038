"""Published draft checkpoints (EAGLE-1/2, EAGLE-3, Medusa, Hydra): synthetic
checkpoints written in the published key layout next to a tiny Llama target. The
loaded heads' logits equal reference forwards written here from each format's
definition (plain torch ops), speculative greedy output equals plain greedy (chain and
trees), sampling runs, mismatched checkpoints are refused, and ``KIND:PATH`` names
resolve through the drafter registry."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.registry.drafters import check_drafter_name, make_drafter
from specloop.realmodels.heads.published import (load_published_eagle, load_published_eagle3,
                                                 load_published_medusa, rope_inv_freq)
from specloop.realmodels.heads.published_hydra import load_published_hydra
from specloop.realmodels.loading import LoadedModel
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import TreePlan

V, H, NH, NKV, I, LAYERS, VD = 256, 64, 4, 2, 96, 8, 160
HD = H // NH


def _target(layers: int = LAYERS, hidden: int = H, vocab: int = V) -> LoadedModel:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=NH, num_key_value_heads=NKV, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=None, name="tiny-llama-64", source="test")


@pytest.fixture(scope="module")
def tiny():
    return _target()


def _draft_config(**extra) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "num_attention_heads": NH,
            "num_key_value_heads": NKV, "intermediate_size": I, "num_hidden_layers": 1, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "vocab_size": V, "rope_scaling": None, **extra}


def _rand(gen, *shape, scale=0.08):
    return torch.randn(*shape, generator=gen) * scale


def _layer_tensors(gen, prefix: str, width: int) -> dict:
    return {f"{prefix}self_attn.q_proj.weight": _rand(gen, NH * HD, width),
            f"{prefix}self_attn.k_proj.weight": _rand(gen, NKV * HD, width),
            f"{prefix}self_attn.v_proj.weight": _rand(gen, NKV * HD, width),
            f"{prefix}self_attn.o_proj.weight": _rand(gen, H, NH * HD),
            f"{prefix}mlp.gate_proj.weight": _rand(gen, I, H), f"{prefix}mlp.up_proj.weight": _rand(gen, I, H),
            f"{prefix}mlp.down_proj.weight": _rand(gen, H, I),
            f"{prefix}post_attention_layernorm.weight": 1 + _rand(gen, H)}


def write_eagle(folder, *, seed=1, bias=True, config=None, binary=False) -> dict:
    gen = torch.Generator().manual_seed(seed)
    t = {"fc.weight": _rand(gen, H, 2 * H), **_layer_tensors(gen, "layers.0.", H)}
    if bias:
        t["fc.bias"] = _rand(gen, H)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or _draft_config(bias=bias)))
    if binary:
        torch.save(t, folder / "pytorch_model.bin")
    else:
        save_file(t, str(folder / "model.safetensors"))
    return t


def write_eagle3(folder, *, seed=2, config=None) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.sort(torch.randperm(V, generator=gen)[:VD]).values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    t = {"fc.weight": _rand(gen, H, 3 * H), **_layer_tensors(gen, "midlayer.", 2 * H),
         "midlayer.hidden_norm.weight": 1 + _rand(gen, H), "midlayer.input_layernorm.weight": 1 + _rand(gen, H),
         "norm.weight": 1 + _rand(gen, H), "lm_head.weight": _rand(gen, VD, H, scale=0.5),
         "d2t": ids - torch.arange(VD), "t2d": t2d}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or _draft_config(draft_vocab_size=VD,
                                                                          target_hidden_size=H)))
    save_file(t, str(folder / "model.safetensors"))
    return t


def write_medusa(folder, *, seed=3, heads=3, layers=1, hidden=H, vocab=V) -> dict:
    gen = torch.Generator().manual_seed(seed)
    t = {}
    for k in range(heads):
        block_w, block_b = _rand(gen, hidden, hidden, scale=0.2), _rand(gen, hidden)
        for layer in range(layers):       # the reference saves one tied block under every l
            t[f"{k}.{layer}.linear.weight"], t[f"{k}.{layer}.linear.bias"] = block_w, block_b
        t[f"{k}.{layers}.weight"] = _rand(gen, vocab, hidden, scale=0.5)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": "tiny"}))
    torch.save(t, folder / "medusa_lm_head.pt")
    return t


def write_hydra(folder, *, seed=4, heads=3, layers=2, grounded=True, arch="mlp", offset=0, embed=None,
                vocab=V, hidden=H) -> dict:
    """The reference's ``HydraMLP.state_dict()``: tied blocks saved under every index."""
    gen = torch.Generator().manual_seed(seed)
    t = {}
    for k in range(heads):
        width = (k + 2) * hidden if grounded else hidden
        w, b = _rand(gen, hidden, width, scale=0.15), _rand(gen, hidden)
        if grounded:
            t[f"hydra_mlp.{k}.0.linear.weight"], t[f"hydra_mlp.{k}.0.linear.bias"] = w, b
            t[f"hydra_mlp.{k}.0.res_connection.weight"] = _rand(gen, hidden, width, scale=0.15)
            t[f"hydra_mlp.{k}.0.res_connection.bias"] = _rand(gen, hidden)
            w, b = _rand(gen, hidden, hidden, scale=0.2), _rand(gen, hidden)
        for layer in range(1 if grounded else 0, layers):
            t[f"hydra_mlp.{k}.{layer}.linear.weight"], t[f"hydra_mlp.{k}.{layer}.linear.bias"] = w, b
        t[f"hydra_lm_head.{k}.weight"] = _rand(gen, vocab, hidden, scale=0.5)
        t[f"hydra_lm_head.{k}.bias"] = _rand(gen, vocab)
    if embed is not None:
        t["input_embed_fn.weight"] = embed
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "hydra_num_heads": heads, "hydra_num_layers": layers, "hydra_head_arch": arch, "grounded_heads": grounded,
        "hidden_state_offset": offset, "base_model_name_or_path": "tiny"}))
    torch.save(t, folder / "hydra_lm_head.pt")
    return t


# ------------------------------------------------------------------ reference forwards
def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, inv=None):            # x [heads, T, d]; Llama halves convention
    if inv is None:
        inv = 1.0 / (10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    ang = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    rot = torch.cat([-x[..., HD // 2:], x[..., :HD // 2]], -1)
    return x * cos + rot * sin


def _ref_layer(t, prefix, attn_in, residual, inv=None):
    """One Llama decoder layer over T positions (causal), attention on attn_in,
    residual given, rotary frequencies ``inv`` (default theta 10^4); returns h [T, H]."""
    n = attn_in.shape[0]
    pos = torch.arange(n)
    q = (attn_in @ t[f"{prefix}self_attn.q_proj.weight"].T).view(n, NH, HD).transpose(0, 1)
    k = (attn_in @ t[f"{prefix}self_attn.k_proj.weight"].T).view(n, NKV, HD).transpose(0, 1)
    v = (attn_in @ t[f"{prefix}self_attn.v_proj.weight"].T).view(n, NKV, HD).transpose(0, 1)
    q, k = _rope(q, pos, inv), _rope(k, pos, inv)
    k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(HD)
    scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    a = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(n, NH * HD)
    h = residual + a @ t[f"{prefix}self_attn.o_proj.weight"].T
    m = _rms(h, t[f"{prefix}post_attention_layernorm.weight"])
    mlp = (F.silu(m @ t[f"{prefix}mlp.gate_proj.weight"].T) * (m @ t[f"{prefix}mlp.up_proj.weight"].T))
    return h + mlp @ t[f"{prefix}mlp.down_proj.weight"].T


def ref_eagle(t, embed, lm, feats, next_tokens, inv=None):
    """EAGLE-1: x = fc([emb; f]); layer without input_layernorm; target LM head."""
    x = torch.cat([embed[next_tokens], feats], -1) @ t["fc.weight"].T + t.get("fc.bias", 0.0)
    h = _ref_layer(t, "layers.0.", x, x, inv)
    return h, h @ lm.T


def ref_eagle3(t, embed, feats, next_tokens, project=True):
    """EAGLE-3: g = fc(features); q/k/v on [in_norm(emb); hidden_norm(g)], residual g;
    lm_head(norm(h)) scattered to target ids d2t + index (-inf elsewhere)."""
    g = feats @ t["fc.weight"].T if project else feats
    e = _rms(embed[next_tokens], t["midlayer.input_layernorm.weight"])
    h = _ref_layer(t, "midlayer.", torch.cat([e, _rms(g, t["midlayer.hidden_norm.weight"])], -1), g)
    return h, _rms(h, t["norm.weight"]) @ t["lm_head.weight"].T


def ref_hydra_mlp(t, k, layers, grounded, u):
    """Head k of HydraMLP on input u: ResBlock(s) then its biased LM head."""
    if grounded:
        x = u @ t[f"hydra_mlp.{k}.0.res_connection.weight"].T + t[f"hydra_mlp.{k}.0.res_connection.bias"]
        x = x + F.silu(u @ t[f"hydra_mlp.{k}.0.linear.weight"].T + t[f"hydra_mlp.{k}.0.linear.bias"])
        rest = range(1, layers)
    else:
        x, rest = u, range(layers)
    for layer in rest:
        x = x + F.silu(x @ t[f"hydra_mlp.{k}.{layer}.linear.weight"].T + t[f"hydra_mlp.{k}.{layer}.linear.bias"])
    return x @ t[f"hydra_lm_head.{k}.weight"].T + t[f"hydra_lm_head.{k}.bias"]


def _features(tiny, ids, layers):
    with torch.no_grad():
        out = tiny.model(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1)


IDS = [5, 17, 33, 9, 120, 77, 3, 200, 14, 61, 90, 45]


# ------------------------------------------------------------------ logits vs reference
@pytest.mark.parametrize("bias,binary", [(True, False), (False, True)])
def test_eagle_logits_equal_the_reference_forward(tiny, tmp_path, bias, binary):
    t = write_eagle(tmp_path / "e", bias=bias, binary=binary)
    drafter = load_published_eagle(tiny, tmp_path / "e")
    embed = tiny.model.get_input_embeddings().weight
    lm = tiny.model.get_output_embeddings().weight
    feats, nxt = _features(tiny, IDS, (-1,))[:-1], torch.tensor(IDS[1:])
    head = drafter.head
    with torch.no_grad():
        cache, h = head.extend(head.empty_cache(), feats, nxt)
        ref_h, ref_logits = ref_eagle(t, embed, lm, feats, nxt)
        torch.testing.assert_close(head.logits(h), ref_logits, atol=1e-4, rtol=1e-4)
        # step 2: the head's own output h_{n-1} as feature, a drafted token after it
        tok = torch.tensor([int(ref_logits[-1].argmax())])
        h2, lg2, _, _ = head.step_nodes(cache, h[-1:], tok, torch.tensor([cache.length]),
                                        cache.k[:, :0], cache.v[:, :0], torch.zeros(1, 0, dtype=torch.bool))
        _, ref2 = ref_eagle(t, embed, lm, torch.cat([feats, ref_h[-1:]]), torch.cat([nxt, tok]))
        torch.testing.assert_close(lg2[0], ref2[-1], atol=1e-4, rtol=1e-4)
    assert drafter.vocab.size == V and drafter.needs_target_hidden == (-1,)


def test_eagle3_logits_equal_the_reference_forward(tiny, tmp_path):
    t = write_eagle3(tmp_path / "e3")
    drafter = load_published_eagle3(tiny, tmp_path / "e3")
    assert drafter.needs_target_hidden == (2, LAYERS // 2, LAYERS - 3)
    assert torch.equal(drafter.vocab.d2t, t["d2t"] + torch.arange(VD))
    embed = tiny.model.get_input_embeddings().weight
    feats, nxt = _features(tiny, IDS, (2, 4, 5))[:-1], torch.tensor(IDS[1:])
    head = drafter.head
    with torch.no_grad():
        cache, h = head.extend(head.empty_cache(), feats, nxt)
        ref_h, ref_logits = ref_eagle3(t, embed, feats, nxt)
        torch.testing.assert_close(head.logits(h), ref_logits, atol=1e-4, rtol=1e-4)
        tok = drafter.vocab.d2t[int(ref_logits[-1].argmax())].reshape(1)
        _, lg2, _, _ = head.step_nodes(cache, h[-1:], tok, torch.tensor([cache.length]),
                                       cache.k[:, :0], cache.v[:, :0], torch.zeros(1, 0, dtype=torch.bool))
        g = torch.cat([feats @ t["fc.weight"].T, ref_h[-1:]])          # step 2 feeds h, not fc(h)
        _, ref2 = ref_eagle3(t, embed, g, torch.cat([nxt, tok]), project=False)
        torch.testing.assert_close(lg2[0], ref2[-1], atol=1e-4, rtol=1e-4)
        # training-time test agrees with incremental inference at step 1
        ttt = drafter.ttt_logits(feats[None], nxt[None], 1)[0][0]
        torch.testing.assert_close(ttt, ref_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layers", [1, 2])
def test_medusa_logits_equal_the_reference_forward(tiny, tmp_path, layers):
    t = write_medusa(tmp_path / "m", layers=layers)
    drafter = load_published_medusa(tiny, tmp_path / "m")
    f = _features(tiny, IDS, (-1,))[-1:]
    for k in range(3):
        x = f
        for _ in range(layers):           # [ResBlock] * L: one block applied L times
            x = x + F.silu(x @ t[f"{k}.0.linear.weight"].T + t[f"{k}.0.linear.bias"])
        with torch.no_grad():
            torch.testing.assert_close(drafter.heads.head_logits(f, k), x @ t[f"{k}.{layers}.weight"].T,
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grounded,layers,offset", [(True, 2, 0), (True, 1, 0), (False, 2, 0), (True, 2, 2)])
def test_hydra_logits_equal_the_reference_forward(tiny, tmp_path, grounded, layers, offset):
    t = write_hydra(tmp_path / "hy", grounded=grounded, layers=layers, offset=offset)
    drafter = load_published_hydra(tiny, tmp_path / "hy")
    assert drafter.needs_target_hidden == (-(offset + 1),)
    embed = tiny.model.get_input_embeddings().weight
    h = _features(tiny, IDS, (-(offset + 1),))[-1:]
    chain = [IDS[-1], 40, 41]                # pending x_{t+1}, then draft tokens d_1, d_2
    state = drafter.root_state(h[0])
    for k in range(3):
        with torch.no_grad():
            state, logits = drafter.expand(state, torch.tensor([chain[k]]), k)
            u = torch.cat([h, *(embed[c][None] for c in chain[:k + 1])], -1) if grounded else h
            torch.testing.assert_close(logits, ref_hydra_mlp(t, k, layers, grounded, u), atol=1e-5, rtol=1e-5)


def test_hydra_saved_embedding_is_used(tiny, tmp_path):
    other = torch.randn(V, H, generator=torch.Generator().manual_seed(9))
    t = write_hydra(tmp_path / "hy", embed=other)
    drafter = load_published_hydra(tiny, tmp_path / "hy")
    h = _features(tiny, IDS, (-1,))[-1:]
    with torch.no_grad():
        _, logits = drafter.expand(drafter.root_state(h[0]), torch.tensor([IDS[-1]]), 0)
    want = ref_hydra_mlp(t, 0, 2, True, torch.cat([h, other[IDS[-1]][None]], -1))
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=1e-5)


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}


def test_llama3_rope_frequencies_equal_transformers():
    from transformers.modeling_rope_utils import _compute_llama3_parameters
    cfg = LlamaConfig(hidden_size=H, num_attention_heads=NH, rope_parameters={**LLAMA3, "rope_theta": 500000.0})
    want, _ = _compute_llama3_parameters(cfg)
    got = rope_inv_freq({"rope_theta": 500000.0, "rope_scaling": LLAMA3}, HD, "eagle3")
    assert torch.equal(got, want.float())
    plain = 1.0 / (500000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    assert not torch.equal(got, plain) and torch.equal(got[0], plain[0])   # scaled low frequencies only


@pytest.mark.parametrize("scaling", [{"type": "linear", "factor": 2.0}, LLAMA3])
def test_eagle_rope_scaling_is_applied(tiny, tmp_path, scaling):
    t = write_eagle(tmp_path / "e", config=_draft_config(bias=True, rope_scaling=scaling, rope_theta=5000.0))
    drafter = load_published_eagle(tiny, tmp_path / "e")
    inv = 1.0 / (5000.0 ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    inv = inv / 2.0 if scaling["type" if "type" in scaling else "rope_type"] == "linear" else \
        rope_inv_freq({"rope_theta": 5000.0, "rope_scaling": scaling}, HD, "eagle")
    embed, lm = tiny.model.get_input_embeddings().weight, tiny.model.get_output_embeddings().weight
    feats, nxt = _features(tiny, IDS, (-1,))[:-1], torch.tensor(IDS[1:])
    with torch.no_grad():
        _, h = drafter.head.extend(drafter.head.empty_cache(), feats, nxt)
        torch.testing.assert_close(drafter.head.logits(h), ref_eagle(t, embed, lm, feats, nxt, inv)[1],
                                   atol=1e-4, rtol=1e-4)
        plain = ref_eagle(t, embed, lm, feats, nxt)[1]
    assert (drafter.head.logits(h) - plain).abs().max() > 1e-3          # the scaling changes the logits


# ------------------------------------------------------------------ lossless decoding
def _plain_greedy(model, prompt, n):
    ids, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return out


PLANS = [FixedDraftPolicy(4), FixedDraftPolicy(6, tree=TreePlan(branching=(3, 2, 1))),
         FixedDraftPolicy(5, tree=TreePlan(top_k=3, max_depth=4, verify_size=10))]
WRITERS = {"eagle": write_eagle, "eagle3": write_eagle3, "medusa": write_medusa, "hydra": write_hydra}
KINDS = ["eagle", "eagle3", "medusa", "hydra"]


@pytest.mark.parametrize("kind", KINDS)
def test_speculative_greedy_equals_plain_greedy_chain_and_tree(tiny, tmp_path, kind):
    WRITERS[kind](tmp_path / kind)
    drafter = make_drafter(f"{kind}:{tmp_path / kind}", tiny)
    expected = {tuple(p): _plain_greedy(tiny.model, p, 20) for p in ([7, 8, 9], IDS)}
    for policy in PLANS:
        decoder = SpeculativeDecoder(tiny, drafter, policy=policy, eos_token_id=-1)
        for prompt, want in expected.items():
            assert decoder.generate(list(prompt), max_new_tokens=20).new_tokens == want, (kind, policy)


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_with_loaded_head_is_reproducible(tiny, tmp_path, kind):
    WRITERS[kind](tmp_path / kind)
    drafter = make_drafter(f"{kind}:{tmp_path / kind}", tiny)
    outs = []
    for _ in range(2):
        decoder = SpeculativeDecoder(tiny, drafter, policy=FixedDraftPolicy(3), sampling=SamplingConfig(1.0),
                                     eos_token_id=-1, seed=5)
        outs.append(decoder.generate(IDS, max_new_tokens=16).new_tokens)
    assert outs[0] == outs[1] and len(outs[0]) == 16 and all(0 <= x < V for x in outs[0])


# ------------------------------------------------------------------ refusals
def test_mismatched_hidden_size_and_vocabulary_are_refused(tiny, tmp_path):
    write_eagle(tmp_path / "h", config=_draft_config(hidden_size=128))
    with pytest.raises(ValueError, match="eagle checkpoint hidden_size 128 does not match the target's 64"):
        load_published_eagle(tiny, tmp_path / "h")
    write_eagle3(tmp_path / "v", config=_draft_config(vocab_size=512, draft_vocab_size=VD))
    with pytest.raises(ValueError, match="eagle3 checkpoint vocab_size 512 does not match the target's 256"):
        load_published_eagle3(tiny, tmp_path / "v")
    write_eagle3(tmp_path / "th", config=_draft_config(draft_vocab_size=VD, target_hidden_size=96))
    with pytest.raises(ValueError, match="target_hidden_size 96 does not match the target's 64"):
        load_published_eagle3(tiny, tmp_path / "th")
    write_medusa(tmp_path / "m", hidden=32)
    with pytest.raises(ValueError, match="medusa checkpoint hidden size 32 does not match the target's 64"):
        load_published_medusa(tiny, tmp_path / "m")
    write_medusa(tmp_path / "mv", vocab=300)
    with pytest.raises(ValueError, match="medusa checkpoint vocabulary 300 does not match the target's 256"):
        load_published_medusa(tiny, tmp_path / "mv")


def test_eagle3_layer_count_is_checked(tmp_path):
    write_eagle3(tmp_path / "a", config=_draft_config(draft_vocab_size=VD,
                                                      eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}))
    with pytest.raises(ValueError, match=r"reads target layers \(2, 16, 29\), the target has 8 layers"):
        load_published_eagle3(_target(), tmp_path / "a")
    write_eagle3(tmp_path / "b")
    with pytest.raises(ValueError, match=r"layer indices \(2, 3, 3\) for a target of 6 layers"):
        load_published_eagle3(_target(layers=6), tmp_path / "b")


def test_malformed_checkpoints_are_refused(tiny, tmp_path):
    t = write_eagle(tmp_path / "x")
    save_file({**t, "layers.0.input_layernorm.weight": torch.ones(H)}, str(tmp_path / "x" / "model.safetensors"))
    with pytest.raises(ValueError, match="input_layernorm"):
        load_published_eagle(tiny, tmp_path / "x")
    t3 = write_eagle3(tmp_path / "y")
    bad = dict(t3)
    bad["t2d"] = torch.zeros(V, dtype=torch.bool)
    save_file(bad, str(tmp_path / "y" / "model.safetensors"))
    with pytest.raises(ValueError, match="t2d does not mark"):
        load_published_eagle3(tiny, tmp_path / "y")
    write_eagle(tmp_path / "r", config=_draft_config(rope_scaling={"type": "dynamic", "factor": 2.0}))
    with pytest.raises(ValueError, match="rope_scaling type 'dynamic'.*supported: linear, llama3"):
        load_published_eagle(tiny, tmp_path / "r")


@pytest.mark.parametrize("arch", ["prefix-mlp", "cross-attn", "eagle-attn", "lstm"])
def test_hydra_other_head_architectures_are_refused_by_name(tiny, tmp_path, arch):
    write_hydra(tmp_path / arch, arch=arch)
    with pytest.raises(ValueError, match=f"hydra_head_arch '{arch}'.*only 'mlp' heads load"):
        load_published_hydra(tiny, tmp_path / arch)


def test_hydra_mismatches_are_refused(tiny, tmp_path):
    write_hydra(tmp_path / "v", vocab=300)
    with pytest.raises(ValueError, match="hydra checkpoint vocabulary 300 does not match the target's 256"):
        load_published_hydra(tiny, tmp_path / "v")
    write_hydra(tmp_path / "h", hidden=32)
    with pytest.raises(ValueError, match="hydra checkpoint hidden size 32 does not match the target's 64"):
        load_published_hydra(tiny, tmp_path / "h")
    t = write_hydra(tmp_path / "x")
    torch.save({**t, "hydra_mlp.0.2.linear.weight": torch.zeros(H, H)}, tmp_path / "x" / "hydra_lm_head.pt")
    with pytest.raises(ValueError, match="tensors this format does not define: hydra_mlp.0.2.linear.weight"):
        load_published_hydra(tiny, tmp_path / "x")
    write_hydra(tmp_path / "o", offset=20)
    with pytest.raises(ValueError, match="hidden_state_offset 20 is outside"):
        load_published_hydra(tiny, tmp_path / "o")


# ------------------------------------------------------------------ registry
def test_registry_kind_path_form(tiny, tmp_path):
    write_eagle3(tmp_path / "e3")
    check_drafter_name(f"eagle3:{tmp_path / 'e3'}")
    drafter = make_drafter(f"eagle3:{tmp_path / 'e3'}", tiny)
    assert drafter.name == "eagle3" and drafter.vocab.size == VD
    with pytest.raises(ValueError, match="neither a local directory nor an HF repo in the local HF cache"):
        check_drafter_name(f"eagle3:{tmp_path / 'missing'}")
    check_drafter_name("eagle3")           # the trained-head name is unchanged


def test_registry_resolves_an_hf_id_from_the_local_cache_only(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snap = cache / "models--someone--eagle3-tiny" / "snapshots" / ("a" * 40)
    write_eagle3(snap)
    (cache / "models--someone--eagle3-tiny" / "refs").mkdir(parents=True)
    (cache / "models--someone--eagle3-tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    drafter = make_drafter("eagle3:someone/eagle3-tiny", tiny)
    assert drafter.vocab.size == VD
    with pytest.raises(ValueError, match="local HF cache"):
        check_drafter_name("eagle3:someone/not-cached")


# ------------------------------------------------------------------ online training
@pytest.mark.parametrize("kind", KINDS)
def test_loaded_heads_train_online_and_stay_lossless(tiny, tmp_path, kind):
    from specloop.realmodels.online import OnlineAdapter, OnlineConfig, OnlineDrafter
    WRITERS[kind](tmp_path / kind)
    inner = make_drafter(f"{kind}:{tmp_path / kind}", tiny)
    before = [p.detach().clone() for p in inner.parameters()]
    adapter = OnlineAdapter(inner, OnlineConfig(learner="ogd", lr=0.05, batch_size=4))
    drafter = OnlineDrafter(inner, adapter)
    for prompt in ([7, 8, 9], IDS):
        result = SpeculativeDecoder(tiny, drafter, policy=FixedDraftPolicy(3), eos_token_id=-1).generate(
            prompt, max_new_tokens=16)
        assert result.new_tokens == _plain_greedy(tiny.model, prompt, 16)
    assert adapter.num_steps > 0
    assert sum(float((a - b.detach()).norm()) for a, b in zip(before, inner.parameters())) > 0
