"""EAGLE-3 heads of the published layout trained by specloop (``--arch published``,
`specloop.realmodels.heads.eagle3_arch`): logits (chain inference and the
training-time test over several steps) equal a reference forward written here from
the published layout in plain torch ops, reading the exported files; train -> export
-> ``eagle3:DIR`` load is bit for bit (every tensor, the drafter's chain and tree
proposals); the choice is saved and refused where it does not apply. A tiny random
Llama target (8 layers, so EAGLE-3's three layers are distinct), float32."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.heads.common import ReducedVocab
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle3_arch import PublishedArchEagle3Head, build_eagle_head, published_eagle3_config
from specloop.realmodels.heads.eagle_drafter import EagleDrafter
from specloop.realmodels.heads.published import PublishedEagle3Head
from specloop.realmodels.heads.published_export import export_published
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.sampling import SamplingConfig
from specloop.realmodels.training.trainer import TrainConfig, get_trainer
from specloop.strategies.base import DraftPlan, TreePlan

from .decoder_util import as_loaded, one_thread, plain_greedy, tiny_llama  # noqa: F401
from .test_train_from_recording import EOS, VOCAB, _config, _items, recording, target  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")

VD = 24          # reduced draft vocabulary of the tiny 32-token target
IDS = [5, 17, 3, 9, 12, 27, 3, 20, 14, 6, 11, 30]


def _random_head(model, seed: int = 0) -> EagleDrafter:
    """A published-arch head with every tensor random (o_proj / down_proj not zero)."""
    gen = torch.Generator().manual_seed(seed)
    d2t = torch.randperm(VOCAB, generator=gen)[:VD]
    cfg = EagleConfig.from_target(model.config, "eagle3", VD, arch="published")
    head = build_eagle_head(cfg, model.get_input_embeddings().weight, model.lm_head.weight[d2t])
    with torch.no_grad():
        for name, p in head.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + torch.randn(p.shape, generator=gen) * (0.3 if "norm" in name else 0.25))
    return EagleDrafter(head.eval(), ReducedVocab(d2t, VOCAB), name="eagle3")


# ----------------------------------------------------------------- reference (published layout)
def _reference(folder):
    """The published EAGLE-3 head of ``folder`` (config.json + model.safetensors) in plain
    torch: returns f(features [T, 3H] or None, g [T, H] or None, next_tokens [T]) ->
    (h [T, H] pre-norm outputs, logits [T, V] in the target vocabulary, -inf off d2t)."""
    cfg = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    nh, nkv, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    vocab, dv = cfg["vocab_size"], cfg["draft_vocab_size"]
    targets = torch.arange(dv) + t["d2t"]             # target id of each draft row
    assert torch.equal(t["t2d"].nonzero()[:, 0], torch.sort(targets).values)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(x, pos):                                 # x [heads, T, hd]; Llama halves
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = pos.float()[:, None] * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    def forward(embed, g, next_tokens):
        n = g.shape[0]
        pos = torch.arange(n)
        e = rms(embed[next_tokens], t["midlayer.input_layernorm.weight"])
        x = torch.cat([e, rms(g, t["midlayer.hidden_norm.weight"])], -1)          # [T, 2H]
        q = (x @ t["midlayer.self_attn.q_proj.weight"].T).view(n, nh, hd).transpose(0, 1)
        k = (x @ t["midlayer.self_attn.k_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
        v = (x @ t["midlayer.self_attn.v_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
        q, k = rope(q, pos), rope(k, pos)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        a = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(n, nh * hd)
        h = g + a @ t["midlayer.self_attn.o_proj.weight"].T                       # residual g
        m = rms(h, t["midlayer.post_attention_layernorm.weight"])
        h = h + (F.silu(m @ t["midlayer.mlp.gate_proj.weight"].T) * (m @ t["midlayer.mlp.up_proj.weight"].T)) \
            @ t["midlayer.mlp.down_proj.weight"].T
        reduced = rms(h, t["norm.weight"]) @ t["lm_head.weight"].T
        full = torch.full((n, vocab), float("-inf"))
        full[:, targets] = reduced
        return h, full

    return forward, t


def _features(model, ids, layers):
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1), [out.hidden_states[i][0] for i in layers]


def _full(drafter, reduced):
    out = torch.full((*reduced.shape[:-1], VOCAB), float("-inf"))
    out[..., drafter.vocab.d2t] = reduced
    return out


def test_logits_equal_the_published_reference_forward_chain_and_ttt(target, tmp_path):
    drafter = _random_head(target.model)
    export_published(drafter, "eagle3", tmp_path / "out", target)
    ref, tensors = _reference(tmp_path / "out")
    embed = target.model.get_input_embeddings().weight
    head = drafter.head
    feats, _ = _features(target.model, IDS, head.config.feature_layers)
    feats, nxt = feats[:-1], torch.tensor(IDS[1:])
    g1 = feats @ tensors["fc.weight"].T                                   # fc over the three layers, 3H -> H
    with torch.no_grad():
        ref_h, ref_logits = ref(embed, g1, nxt)
        cache, h = head.extend(head.empty_cache(), feats, nxt)            # inference, true features
        torch.testing.assert_close(_full(drafter, head.logits(h)), ref_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(h, ref_h, atol=1e-5, rtol=1e-5)
        # training-time test: step s at position i drafts from anchor a = i-s+1 with the
        # head's own pre-norm outputs as g for the s-1 positions after it
        steps = 4
        outs = head.forward_ttt(feats[None], nxt[None], steps)
        n = len(nxt)
        for s in range(1, steps + 1):
            for i in range(s - 1, n):
                a = i - s + 1
                g, toks = g1[:a + 1], nxt[:a + 1]
                hh, lg = ref(embed, g, toks)
                for j in range(1, s):                                      # chain node at position a+j
                    g, toks = torch.cat([g, hh[-1:]]), nxt[:a + j + 1]
                    hh, lg = ref(embed, g, toks)
                torch.testing.assert_close(_full(drafter, outs[s - 1][1][0, i]), lg[-1], atol=1e-5, rtol=1e-5)
        # one tree step (step_nodes) from the last true position
        tok = drafter.vocab.d2t[int(ref_logits[-1][drafter.vocab.d2t].argmax())].reshape(1)
        _, lg2, _, _ = head.step_nodes(cache, h[-1:], tok, torch.tensor([cache.length]),
                                       cache.k[:, :0], cache.v[:, :0], torch.zeros(1, 0, dtype=torch.bool))
        _, ref2 = ref(embed, torch.cat([g1, ref_h[-1:]]), torch.cat([nxt, tok]))
        torch.testing.assert_close(_full(drafter, lg2[0]), ref2[-1], atol=1e-5, rtol=1e-5)


def test_exported_tensor_names_and_shapes(target, tmp_path):
    drafter = _random_head(target.model)
    export_published(drafter, "eagle3", tmp_path / "out", target)
    c = target.model.config
    hsz, nh, nkv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    hd, inter = hsz // nh, c.intermediate_size
    want = {"fc.weight": (hsz, 3 * hsz), "midlayer.input_layernorm.weight": (hsz,),
            "midlayer.hidden_norm.weight": (hsz,), "midlayer.post_attention_layernorm.weight": (hsz,),
            "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * hsz),
            "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * hsz),
            "midlayer.self_attn.v_proj.weight": (nkv * hd, 2 * hsz),
            "midlayer.self_attn.o_proj.weight": (hsz, nh * hd), "midlayer.mlp.gate_proj.weight": (inter, hsz),
            "midlayer.mlp.up_proj.weight": (inter, hsz), "midlayer.mlp.down_proj.weight": (hsz, inter),
            "norm.weight": (hsz,), "lm_head.weight": (VD, hsz), "d2t": (VD,), "t2d": (VOCAB,)}
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in got.items()} == want
    assert got["d2t"].dtype == torch.int64 and got["t2d"].dtype == torch.bool
    assert torch.equal(got["d2t"] + torch.arange(VD), drafter.vocab.d2t)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["num_hidden_layers"]) == (VD, VOCAB, 1)
    assert cfg["target_hidden_size"] == hsz and cfg["max_position_embeddings"] == c.max_position_embeddings
    assert "eagle_config" not in cfg            # the default layers (2, L//2, L-3)


def _states(drafter):
    return {**drafter.head.state_dict(), "embed_weight": drafter.head.embed_weight, "d2t": drafter.vocab.d2t}


def _proposals(drafter, model, prompt):
    """The drafter's proposals for ``prompt`` under a greedy chain, a sampled chain, a
    static and an EAGLE-2 dynamic tree (each after a fresh reset)."""
    _, hidden = _features(model, prompt, drafter.needs_target_hidden)
    ids = torch.tensor(prompt)
    out = []
    for plan, sampling in ((DraftPlan(5), SamplingConfig()), (DraftPlan(4), SamplingConfig(temperature=1.0)),
                           (DraftPlan(3, tree=TreePlan(branching=(3, 2, 1))), SamplingConfig()),
                           (DraftPlan(4, tree=TreePlan(top_k=3, max_depth=4, verify_size=10)), SamplingConfig())):
        drafter.reset(ids, target_hidden=tuple(hidden))
        prop = drafter.propose(DraftRequest(ids, plan, 32, sampling, torch.Generator().manual_seed(7)))
        out.append(prop)
    return out


def test_train_export_load_round_trips_bit_for_bit(target, recording, tmp_path):
    report = get_trainer("eagle3")(_config("eagle3", recording, tmp_path / "head", steps=40, ttt_steps=3,
                                           draft_vocab_size=VD, arch="published"), loaded=target, progress=False)
    assert len(report["heldout_top1_per_step"]) == 3
    saved = json.loads((tmp_path / "head" / "draft.json").read_text())
    assert saved["config"]["arch"] == "published" and saved["train_config"]["arch"] == "published"
    trained = make_drafter("eagle3", target, checkpoint=str(tmp_path / "head"), train_if_missing=False,
                           progress=False)
    assert type(trained.head) is PublishedArchEagle3Head and trained.head.config.arch == "published"
    export_published(trained, "eagle3", tmp_path / "out", target)
    loaded = make_drafter(f"eagle3:{tmp_path / 'out'}", target)
    assert type(loaded.head) is PublishedEagle3Head and loaded.head.config == trained.head.config
    a, b = _states(trained), _states(loaded)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype == (torch.int64 if key == "d2t" else torch.float32), key
        assert torch.equal(a[key], b[key]), key
    for prompt in (IDS, list(_items(3)[2].ids)):
        for pa, pb in zip(_proposals(trained, target.model, prompt), _proposals(loaded, target.model, prompt)):
            assert torch.equal(pa.tokens, pb.tokens) and torch.equal(pa.parents, pb.parents)
            assert (pa.q_draft is None) == (pb.q_draft is None)
            if pa.q_draft is not None:
                assert torch.equal(pa.q_draft, pb.q_draft)
            if pa.node_probs is not None:
                assert torch.equal(pa.node_probs, pb.node_probs)
    # the loaded copy exports to the same files
    export_published(loaded, "eagle3", tmp_path / "again", target)
    first, second = load_file(str(tmp_path / "out" / "model.safetensors")), \
        load_file(str(tmp_path / "again" / "model.safetensors"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == \
        json.loads((tmp_path / "again" / "config.json").read_text())


def test_trained_published_head_lowers_the_loss_and_drafts_losslessly(target, recording, tmp_path):
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.policy import FixedDraftPolicy
    from specloop.realmodels.training.recording_data import open_recording_splits
    from specloop.realmodels.training.train_eagle import ttt_loss
    train, _, _ = open_recording_splits([recording], "tiny", target.model, "eagle3")
    batch = train.window_sampler(16, 16, seed=7).sample()
    losses, drafters = [], []
    for steps in (1, 60):
        get_trainer("eagle3")(_config("eagle3", recording, tmp_path / str(steps), steps=steps, arch="published"),
                              loaded=target, progress=False)
        drafter = make_drafter("eagle3", target, checkpoint=str(tmp_path / str(steps)), train_if_missing=False,
                               progress=False)
        with torch.no_grad():
            losses.append(float(ttt_loss(drafter.head, batch, drafter.vocab.t2d, drafter.vocab.d2t, 2)[0]))
        drafters.append(drafter)
    assert losses[1] < 0.8 * losses[0], losses
    accepted = 0
    for policy in (FixedDraftPolicy(3), FixedDraftPolicy(4, tree=TreePlan(branching=(2, 2, 1))),
                   FixedDraftPolicy(4, tree=TreePlan(top_k=2, max_depth=4, verify_size=6))):
        decoder = SpeculativeDecoder(target, drafters[1], policy=policy, eos_token_id=EOS)
        for item in _items(PROMPTS_CHECKED)[1:3]:
            result = decoder.generate(list(item.ids), 16)
            assert result.new_tokens == plain_greedy(target.model, list(item.ids), 16, EOS)
            accepted += sum(r.accepted_tokens for r in result.trace)
    assert accepted > 0


PROMPTS_CHECKED = 4


def test_arch_is_saved_validated_and_backward_compatible(target):
    base = EagleConfig.from_target(target.model.config, "eagle3", VD)
    assert base.arch == "specloop" and "arch" not in base.to_dict()       # files written before the option
    assert EagleConfig(**base.to_dict()) == base
    pub = EagleConfig.from_target(target.model.config, "eagle3", VD, arch="published")
    assert pub.to_dict()["arch"] == "published" and EagleConfig(**pub.to_dict()) == pub
    emb, rows = target.model.get_input_embeddings().weight, target.model.lm_head.weight[:VD]
    assert type(build_eagle_head(base, emb, rows)) is EagleHead
    assert type(build_eagle_head(pub, emb, rows)) is PublishedArchEagle3Head
    with pytest.raises(ValueError, match="arch must be 'specloop' or 'published'"):
        EagleConfig.from_target(target.model.config, "eagle3", VD, arch="vllm")
    with pytest.raises(ValueError, match="needs kind 'eagle3'"):
        EagleConfig.from_target(target.model.config, "eagle", VD, arch="published")
    with pytest.raises(ValueError, match="published config"):
        published_eagle3_config(base, target.model.config)
    assert "arch" not in TrainConfig(kind="eagle3").to_dict()
    assert TrainConfig(kind="eagle3", arch="published").to_dict()["arch"] == "published"
    with pytest.raises(ValueError, match="needs kind 'eagle3'"):
        TrainConfig(kind="hydra", arch="published")
    with pytest.raises(ValueError, match="TrainConfig.arch must be"):
        TrainConfig(kind="eagle3", arch="x")


def test_other_fused_layers_are_written_in_the_config(target):
    cfg = EagleConfig.from_target(target.model.config, "eagle3", VD, feature_layers=(1, 3, 6), arch="published")
    out = published_eagle3_config(cfg, target.model.config)
    assert out["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}


def test_init_from_another_arch_is_refused(target, recording, tmp_path):
    get_trainer("eagle3")(_config("eagle3", recording, tmp_path / "a", steps=2), loaded=target, progress=False)
    with pytest.raises(ValueError, match="arch 'specloop', not 'published'.*--arch specloop"):
        get_trainer("eagle3")(_config("eagle3", recording, tmp_path / "b", steps=2, arch="published",
                                      init_from=str(tmp_path / "a")), loaded=target, progress=False)


def test_cli_arch_flag(recording, tmp_path, capsys):
    from specloop.cli import build_parser, main
    from specloop.cli.draft_cmd import _train_config
    args = build_parser().parse_args(["draft", "train", "--kind", "eagle3", "--target", "tiny", "--quick",
                                      "--from-recording", str(recording), "--arch", "published"])
    assert _train_config(args).arch == "published"
    args = build_parser().parse_args(["draft", "train", "--kind", "eagle3", "--target", "tiny", "--quick",
                                      "--from-recording", str(recording)])
    assert _train_config(args).arch == "specloop"
    assert main(["draft", "train", "--kind", "hydra", "--arch", "published", "--out", str(tmp_path / "d")]) == 2
    assert "--arch chooses the EAGLE-3 layer: it needs --kind eagle3, not hydra" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["draft", "train", "--kind", "eagle3", "--arch", "vllm"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["draft", "train", "--help"])
    assert "--arch {specloop,published}" in capsys.readouterr().out


def test_epoch_run_keeps_its_arch_across_resumes(target, recording, tmp_path):
    def config(arch, **over):
        return _config("eagle3", recording, tmp_path / "run", epochs=1, checkpoint_every_steps=2,
                       checkpoint_every_minutes=0.0, arch=arch, **over)
    part = get_trainer("eagle3")(config("published", budget_minutes=1e-7), loaded=target, progress=False)
    assert not part["complete"]
    with pytest.raises(ValueError, match="other settings.*architecture"):      # another layer does not resume
        get_trainer("eagle3")(config("specloop"), loaded=target, progress=False)
    done = get_trainer("eagle3")(config("published"), loaded=target, progress=False)
    assert done["complete"] and done["sessions"] == 2
    drafter = make_drafter("eagle3", target, checkpoint=str(tmp_path / "run"), train_if_missing=False,
                           progress=False)
    assert type(drafter.head) is PublishedArchEagle3Head


def test_cli_export_writes_a_published_arch_head_without_vllm_notes(target, recording, tmp_path, capsys,
                                                                    monkeypatch):
    import specloop.realmodels.loading as loading
    from specloop.cli import main
    get_trainer("eagle3")(_config("eagle3", recording, tmp_path / "head", steps=3, arch="published"), loaded=target,
                          progress=False)
    monkeypatch.setattr(loading, "load_model", lambda name, **kw: target)
    code = main(["draft", "export", "--target", "tiny", "--kind", "eagle3", "--checkpoint", str(tmp_path / "head"),
                 "--format", "eagle3", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "note:" not in captured.err and "as eagle3" in captured.out
    trained = make_drafter("eagle3", target, checkpoint=str(tmp_path / "head"), train_if_missing=False,
                           progress=False)
    loaded = make_drafter(f"eagle3:{tmp_path / 'out'}", target)
    a, b = _states(trained), _states(loaded)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    get_trainer("eagle3")(_config("eagle3", recording, tmp_path / "own", steps=3), loaded=target, progress=False)
    assert main(["draft", "export", "--target", "tiny", "--kind", "eagle3", "--checkpoint", str(tmp_path / "own"),
                 "--format", "eagle3", "--out", str(tmp_path / "refused")]) == 2
    assert "train the head with --arch published" in capsys.readouterr().err
