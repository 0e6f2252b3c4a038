"""Export to the published layouts (issue 22 item 2): load -> export -> load is bit for
bit for EAGLE-1/2, EAGLE-3 and Medusa checkpoints (also after online updates);
specloop's own full-vocabulary Medusa heads export to identical logits; heads that do
not convert exactly are refused with the reason (API and ``specloop draft export``)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specloop.cli import main
from specloop.realmodels.drafters.registry import make_drafter
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle_drafter import EagleDrafter
from specloop.realmodels.heads.common import ReducedVocab
from specloop.realmodels.heads.head_drafting import MedusaDrafter
from specloop.realmodels.heads.medusa import build_medusa
from specloop.realmodels.heads.published_export import export_published
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
