"""Write draft heads in the published layouts (EAGLE-1/2, EAGLE-3, Medusa) that
`specloop.realmodels.heads.published` reads (formats and sources described there).

What converts exactly, and what is refused (a one-line ``ValueError`` with the reason):

* A head loaded from a published checkpoint (``eagle:``, ``eagle3:``, ``medusa:``) and
  possibly trained online since: written back in its own format, every tensor as the
  drafter holds it (load -> export -> load is bit for bit). The embeddings are written
  (``embed_tokens.weight``) only when they differ from the target's.
* specloop's own Medusa heads (`MedusaHeads`) -> ``medusa``: exact when the shared
  LM head covers the whole vocabulary (V_draft = V; its rows are put back in target
  order and copied into every head's ``Linear(H, V)``) and each head's blocks are
  one tied block (L = 1, or L equal blocks: the reference builds ``[ResBlock] * L``).
  A reduced vocabulary is refused: a bias-free full-vocabulary head cannot give the
  tokens outside it zero probability.
* specloop's own EAGLE head (``eagle``) is refused for the ``eagle`` format: it RMS-
  normalises the embedding and feature halves before ``fc`` and the layer input
  before attention (EAGLE-1/2 has none of these norms; a norm of a varying vector
  does not fold into a linear map), and it drafts over a reduced vocabulary while
  EAGLE-1/2 uses the target's full LM head.
* specloop's own EAGLE-3 head (``eagle3``) is refused for the ``eagle3`` format: it
  mixes [norm(emb); norm(g)] through a 2H -> H ``fuse`` layer and RMS-normalises that
  before attention with the fused vector as residual, while EAGLE-3 feeds
  [input_layernorm(emb); hidden_norm(g)] (2H) to q/k/v with residual g. (Its reduced
  vocabulary alone would convert exactly: it is EAGLE-3's ``d2t`` / ``t2d``.)
* Any head into another family's format is refused.

Output folders: ``config.json`` plus ``model.safetensors`` (EAGLE, EAGLE-3, as the
reference's ``ea_model`` and vLLM read them) or ``medusa_lm_head.pt`` (Medusa's
reference ``medusa_model``; vLLM's ``medusa`` method reads its own converted layout).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["EXPORT_FORMATS", "export_published"]

EXPORT_FORMATS = ("eagle", "eagle3", "medusa")

_EAGLE_REFUSAL = ("specloop's EAGLE head cannot be written as EAGLE-1/2 exactly: it RMS-normalises the embedding "
                  "and feature halves before fc and the layer input before attention (the format has none of "
                  "these norms, and a norm does not fold into fc), and it drafts over a reduced vocabulary where "
                  "EAGLE-1/2 uses the target's full LM head")
_EAGLE3_REFUSAL = ("specloop's EAGLE-3 head cannot be written as EAGLE-3 exactly: its 2H -> H fuse layer and the "
                   "RMSNorm of the fused input before attention (with the fused vector as residual) have no "
                   "counterpart in the format, whose q/k/v read [input_layernorm(emb); hidden_norm(g)] with "
                   "residual g (the reduced vocabulary alone would convert, as d2t/t2d)")


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous()


def _layer(head, prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        lin = getattr(head, name.split(".")[1])
        out[f"{prefix}{name}.weight"] = _cpu(lin.weight)
        if lin.bias is not None:
            out[f"{prefix}{name}.bias"] = _cpu(lin.bias)
    out[f"{prefix}post_attention_layernorm.weight"] = _cpu(head.post_norm.weight)
    return out


def _embedding_if_own(head, target) -> dict[str, torch.Tensor]:
    own = head.embed_weight.detach().float().cpu()
    base = target.model.get_input_embeddings().weight.detach().float().cpu()
    return {} if torch.equal(own, base) else {"embed_tokens.weight": _cpu(head.embed_weight)}


def _eagle_tensors(drafter, target) -> tuple[dict, dict]:
    from specloop.realmodels.heads.published import PublishedEagleHead
    head = drafter.head
    if not isinstance(head, PublishedEagleHead):
        raise ValueError(_EAGLE_REFUSAL)
    t = {"fc.weight": _cpu(head.fuse.weight), **_layer(head, "layers.0."), **_embedding_if_own(head, target)}
    if head.fuse.bias is not None:
        t["fc.bias"] = _cpu(head.fuse.bias)
    cfg = {**head.published_config, "bias": head.fuse.bias is not None,
           "qkv_bias": head.q_proj.bias is not None}
    return t, cfg


def _eagle3_tensors(drafter, target) -> tuple[dict, dict]:
    from specloop.realmodels.heads.published import PublishedEagle3Head
    head = drafter.head
    if not isinstance(head, PublishedEagle3Head):
        raise ValueError(_EAGLE3_REFUSAL)
    d2t = drafter.vocab.d2t.detach().cpu().long()
    t2d = torch.zeros(drafter.vocab.target_vocab_size, dtype=torch.bool)
    t2d[d2t] = True
    t = {"fc.weight": _cpu(head.fc_feat.weight), **_layer(head, "midlayer."),
         "midlayer.input_layernorm.weight": _cpu(head.norm_emb.weight),
         "midlayer.hidden_norm.weight": _cpu(head.input_norm.hidden_norm.weight),
         "norm.weight": _cpu(head.out_norm.weight), "lm_head.weight": _cpu(head.lm_head),
         "d2t": d2t - torch.arange(d2t.numel()), "t2d": t2d, **_embedding_if_own(head, target)}
    cfg = {**head.published_config, "draft_vocab_size": int(d2t.numel())}
    return t, cfg


def _medusa_tensors(drafter, target) -> tuple[dict, dict]:
    from specloop.realmodels.heads.medusa import MedusaHeads
    from specloop.realmodels.heads.published import PublishedMedusaHeads
    heads = drafter.heads
    if isinstance(heads, PublishedMedusaHeads):
        blocks = [(b.weight, b.bias) for b in heads.blocks]
        outs = [o.weight for o in heads.outs]
        cfg = dict(heads.published_config)
    elif isinstance(heads, MedusaHeads):
        blocks, outs, cfg = _specloop_medusa(heads)
    else:
        raise ValueError(f"a {type(heads).__name__} cannot be written as Medusa heads")
    layers = int(cfg.get("medusa_num_layers", 1))
    t = {}
    for k, ((w, b), out) in enumerate(zip(blocks, outs)):
        for layer in range(layers):          # the reference saves its tied block under every index
            t[f"{k}.{layer}.linear.weight"], t[f"{k}.{layer}.linear.bias"] = _cpu(w), _cpu(b)
        t[f"{k}.{layers}.weight"] = _cpu(out)
    return t, {**cfg, "medusa_num_heads": len(outs), "medusa_num_layers": layers}


def _specloop_medusa(heads) -> tuple[list, list, dict]:
    c = heads.config
    if c.draft_vocab_size != c.target_vocab_size:
        raise ValueError(f"specloop's Medusa heads draft over a reduced vocabulary of {c.draft_vocab_size} of "
                         f"{c.target_vocab_size} tokens; Medusa's format gives every head a bias-free "
                         "full-vocabulary LM head, which cannot give the other tokens zero probability (train "
                         f"with --vocab-size {c.target_vocab_size} to export)")
    blocks = []
    for k, head in enumerate(heads.heads):
        first = head[0].linear
        if any(not (torch.equal(b.linear.weight, first.weight) and torch.equal(b.linear.bias, first.bias))
               for b in head):
            raise ValueError(f"specloop's Medusa head {k} has {c.num_layers} different residual blocks; Medusa's "
                             "format applies one tied block L times ([ResBlock] * L)")
        blocks.append((first.weight, first.bias))
    proj = heads.lm_head.proj.weight
    full = torch.empty(c.target_vocab_size, c.hidden_size, dtype=proj.dtype, device=proj.device)
    full[heads.lm_head.draft_to_target] = proj.detach()
    return blocks, [full] * c.num_heads, {"medusa_num_layers": c.num_layers}


def _family(drafter) -> str:
    """'eagle' / 'eagle3' (EAGLE heads), 'medusa' or 'hydra' (feature heads)."""
    from specloop.realmodels.heads.medusa import MedusaHeads
    from specloop.realmodels.heads.published import PublishedMedusaHeads
    head, heads = getattr(drafter, "head", None), getattr(drafter, "heads", None)
    if head is not None and getattr(getattr(head, "config", None), "kind", None) in ("eagle", "eagle3"):
        return head.config.kind
    if heads is not None:
        return "medusa" if isinstance(heads, (MedusaHeads, PublishedMedusaHeads)) else "hydra"
    raise ValueError(f"a {type(drafter).__name__} drafter has no draft head to export")


def export_published(drafter, fmt: str, out: str | Path, target) -> Path:
    """Write ``drafter``'s head to folder ``out`` in published format ``fmt``.

    Args:
        drafter: an `EagleDrafter` (EAGLE / EAGLE-3 head) or `MedusaDrafter`, possibly
            wrapped by an online drafter (its ``inner`` is used).
        fmt: one of `EXPORT_FORMATS`.
        out: folder (created); ``config.json`` and the weights file are replaced.
        target: the `LoadedModel` the head drafts for (its embeddings decide whether
            ``embed_tokens.weight`` is written).

    Returns:
        The folder.

    Raises:
        ValueError: unknown format, or a head that does not convert exactly (the
            reason named; see the module docstring).
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    drafter = getattr(drafter, "inner", drafter)
    family = _family(drafter)
    if family != fmt:
        raise ValueError(f"a{'n' if family[0] == 'e' else ''} {family} head cannot be written in the {fmt} format"
                         + (f" (export it as {family})" if family in EXPORT_FORMATS else ""))
    tensors, cfg = {"eagle": _eagle_tensors, "eagle3": _eagle3_tensors, "medusa": _medusa_tensors}[fmt](
        drafter, target)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    if fmt == "medusa":
        torch.save(tensors, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file
        save_file(tensors, str(folder / "model.safetensors"))
    return folder
