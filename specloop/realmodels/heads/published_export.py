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
* specloop's own EAGLE-3 head (``eagle3``, ``--arch specloop``, the default) is refused
  for the ``eagle3`` format: it mixes [norm(emb); norm(g)] through a 2H -> H ``fuse``
  layer and RMS-normalises that before attention with the fused vector as residual,
  while EAGLE-3 feeds [input_layernorm(emb); hidden_norm(g)] (2H) to q/k/v with
  residual g. (Its reduced vocabulary alone would convert exactly: it is EAGLE-3's
  ``d2t`` / ``t2d``.)
* An EAGLE-3 head trained with ``--arch published``
  (`specloop.realmodels.heads.eagle3_arch`) is that layer: it is written exactly,
  tensors (float32, as trained; H hidden, V target vocabulary, V_d draft vocabulary)
  ``fc.weight`` [H, 3H], ``midlayer.input_layernorm.weight`` /
  ``midlayer.hidden_norm.weight`` / ``midlayer.post_attention_layernorm.weight`` [H],
  ``midlayer.self_attn.q_proj.weight`` [nh*hd, 2H], ``k_proj`` / ``v_proj`` [nkv*hd, 2H],
  ``o_proj`` [H, nh*hd], ``midlayer.mlp.gate_proj`` / ``up_proj`` [I, H], ``down_proj``
  [H, I], ``norm.weight`` [H], ``lm_head.weight`` [V_d, H], ``d2t`` int64 [V_d]
  (target id - draft id) and ``t2d`` bool [V]; ``config.json`` from
  `eagle3_arch.published_eagle3_config` (no ``embed_tokens``: it uses the target's).
* Any head into another family's format is refused.

* ``vllm-medusa``: vLLM's own Medusa layout (below). It converts more than ``medusa``:
  vLLM gives each of the L blocks its own weights (untied heads export exactly) and
  reads a reduced vocabulary as ``token_map`` (-inf logits elsewhere, as specloop's
  zero probability), so every Medusa head converts exactly.

Output folders: ``config.json`` plus ``model.safetensors`` (EAGLE, EAGLE-3, as the
reference's ``ea_model`` and vLLM read them; ``vllm-medusa``) or ``medusa_lm_head.pt``
(``medusa``, for Medusa's reference ``medusa_model``; vLLM's default loader reads only
``*.safetensors`` / ``*.bin``, so vLLM needs ``vllm-medusa``).

vLLM check (read at vllm-project/vllm commit eca18691d2fe29c4f6c1b466709eda9f123116ea,
2025-05-21, files ``vllm/model_executor/models/{medusa,llama_eagle,llama_eagle3,llama}.py``,
``vllm/transformers_utils/configs/{medusa,eagle}.py``, ``model_loader/default_loader.py``;
cross-checked against later stored versions: medusa.py 09cddad8, llama_eagle.py 00da9231,
llama_eagle3.py 00bd1493):

* **Medusa** (``Medusa.load_weights``): names ``blocks.{k}.layers.{l}.weight`` [H, H],
  ``blocks.{k}.layers.{l}.bias`` [H] (only when the config says ``medusa_fc_bias``;
  default false), ``lm_heads.{k}.weight`` [V', H], optional ``token_map`` int64 [V']
  (read only when ``truncated_vocab_size`` V' < ``vocab_size``; logits are -inf off
  it; with V' = V the rows are in target order), a ``medusa_heads.`` prefix stripped.
  ``MedusaConfig`` (``model_type: medusa``, architecture ``MedusaModel``): ``hidden_size``,
  ``vocab_size``, ``num_heads``, ``num_hidden_layers``, ``truncated_vocab_size``;
  its ``from_pretrained`` renames every key holding "num" and "heads" / "layers" to
  those two, so no other such key is written. Block l applies x + SiLU(W_l x + b_l).
* **EAGLE-1/2** (``EagleLlamaForCausalLM``): ``fc.weight`` [H, 2H] and ``layers.0.*`` as
  written here; but vLLM builds ``fc`` without a bias (``fc.bias`` fails to load at the
  pinned commit, is skipped later) and reads ``"bias": true`` as an o_proj bias, and it
  always uses the target's embeddings: `vllm_notes` names such folders.
* **EAGLE-3** (``Eagle3LlamaForCausalLM``): ``fc.weight``, ``midlayer.*`` (renamed
  ``layers.0.*``), ``norm.weight``, ``lm_head.weight`` [draft_vocab_size, H], ``d2t``
  (offsets, as written), ``t2d`` skipped, config ``draft_vocab_size`` required,
  ``target_hidden_size`` optional; the target layers fused are always (2, L//2, L-3)
  and ``norm_before_residual`` / a head's own ``embed_tokens`` are not read at the
  pinned commit (`vllm_notes`).
* Both EAGLE methods pick the draft architecture from the config's ``architectures``
  (``LlamaForCausalLM`` -> ``Eagle[3]LlamaForCausalLM``) and need ``model_type``;
  both are written (default ``llama``) when the source config lacks them.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["EXPORT_FORMATS", "export_published", "vllm_notes", "VLLM_COMMIT"]

EXPORT_FORMATS = ("eagle", "eagle3", "medusa", "vllm-medusa")
_FAMILY = {"eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "vllm-medusa": "medusa"}
VLLM_COMMIT = "eca18691d2fe29c4f6c1b466709eda9f123116ea"
_LLAMA_IDS = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}

_EAGLE_REFUSAL = ("specloop's EAGLE head cannot be written as EAGLE-1/2 exactly: it RMS-normalises the embedding "
                  "and feature halves before fc and the layer input before attention (the format has none of "
                  "these norms, and a norm does not fold into fc), and it drafts over a reduced vocabulary where "
                  "EAGLE-1/2 uses the target's full LM head")
_EAGLE3_REFUSAL = ("specloop's EAGLE-3 head cannot be written as EAGLE-3 exactly: its 2H -> H fuse layer and the "
                   "RMSNorm of the fused input before attention (with the fused vector as residual) have no "
                   "counterpart in the format, whose q/k/v read [input_layernorm(emb); hidden_norm(g)] with "
                   "residual g (the reduced vocabulary alone would convert, as d2t/t2d); train the head with "
                   "--arch published to export it")


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
    cfg = {**_LLAMA_IDS, **head.published_config, "bias": head.fuse.bias is not None,
           "qkv_bias": head.q_proj.bias is not None}
    return t, cfg


def _eagle3_tensors(drafter, target) -> tuple[dict, dict]:
    from specloop.realmodels.heads.eagle3_arch import PublishedArchEagle3Head, published_eagle3_config
    head = drafter.head
    if not isinstance(head, PublishedArchEagle3Head):      # a published checkpoint's or --arch published
        raise ValueError(_EAGLE3_REFUSAL)
    d2t = drafter.vocab.d2t.detach().cpu().long()
    t2d = torch.zeros(drafter.vocab.target_vocab_size, dtype=torch.bool)
    t2d[d2t] = True
    t = {"fc.weight": _cpu(head.fc_feat.weight), **_layer(head, "midlayer."),
         "midlayer.input_layernorm.weight": _cpu(head.norm_emb.weight),
         "midlayer.hidden_norm.weight": _cpu(head.input_norm.hidden_norm.weight),
         "norm.weight": _cpu(head.out_norm.weight), "lm_head.weight": _cpu(head.lm_head),
         "d2t": d2t - torch.arange(d2t.numel()), "t2d": t2d, **_embedding_if_own(head, target)}
    source = getattr(head, "published_config", None)
    if source is None:      # trained by specloop (--arch published): the config from its shapes
        source = published_eagle3_config(head.config, target.model.config)
    cfg = {**_LLAMA_IDS, **source, "draft_vocab_size": int(d2t.numel())}
    return t, cfg


def _medusa_parts(drafter) -> tuple[list, list, torch.Tensor, dict]:
    """A Medusa drafter's heads as (blocks[k][l] = (W [H, H], b [H]), outs[k] = [V_d, H]
    LM-head rows, d2t int64 [V_d] = the target id of each row, source config)."""
    from specloop.realmodels.heads.medusa import MedusaHeads
    from specloop.realmodels.heads.published import PublishedMedusaHeads
    heads = drafter.heads
    if isinstance(heads, PublishedMedusaHeads):          # one tied block per head, applied L times
        layers = heads.config.num_layers
        blocks = [[(b.weight, b.bias)] * layers for b in heads.blocks]
        return blocks, [o.weight for o in heads.outs], torch.arange(heads.config.target_vocab_size), \
            dict(heads.published_config)
    if isinstance(heads, MedusaHeads):                   # own blocks per layer, one shared reduced LM head
        blocks = [[(b.linear.weight, b.linear.bias) for b in head] for head in heads.heads]
        return blocks, [heads.lm_head.proj.weight] * len(blocks), heads.lm_head.draft_to_target, {}
    raise ValueError(f"a {type(heads).__name__} cannot be written as Medusa heads")


def _target_order(rows: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """[V, H] rows in target-id order from full-vocabulary rows in draft order."""
    full = torch.empty_like(rows, device="cpu")
    full[d2t.cpu()] = _cpu(rows)
    return full


def _medusa_tensors(drafter, target) -> tuple[dict, dict]:
    """FasterDecoding/Medusa's ``medusa_lm_head.pt`` keys (tied blocks, full vocabulary)."""
    blocks, outs, d2t, cfg = _medusa_parts(drafter)
    vocab = drafter.heads.config.target_vocab_size
    if d2t.numel() != vocab:
        raise ValueError(f"specloop's Medusa heads draft over a reduced vocabulary of {d2t.numel()} of "
                         f"{vocab} tokens; Medusa's format gives every head a bias-free "
                         "full-vocabulary LM head, which cannot give the other tokens zero probability (train "
                         f"with --vocab-size {vocab}, or export as vllm-medusa)")
    for k, head in enumerate(blocks):
        w0, b0 = head[0]
        if any(not (torch.equal(w, w0) and torch.equal(b, b0)) for w, b in head):
            raise ValueError(f"specloop's Medusa head {k} has {len(head)} different residual blocks; Medusa's "
                             "format applies one tied block L times ([ResBlock] * L) (export as vllm-medusa)")
    layers = len(blocks[0])
    t = {}
    for k, (head, out) in enumerate(zip(blocks, outs)):
        for layer in range(layers):          # the reference saves its tied block under every index
            t[f"{k}.{layer}.linear.weight"], t[f"{k}.{layer}.linear.bias"] = _cpu(head[0][0]), _cpu(head[0][1])
        t[f"{k}.{layers}.weight"] = _target_order(out, d2t)
    return t, {**cfg, "medusa_num_heads": len(outs), "medusa_num_layers": layers}


def _vllm_medusa_tensors(drafter, target) -> tuple[dict, dict]:
    """vLLM's Medusa names (module docstring); every Medusa head converts exactly."""
    blocks, outs, d2t, _ = _medusa_parts(drafter)
    c = drafter.heads.config
    reduced = d2t.numel() < c.target_vocab_size
    t = {}
    for k, (head, out) in enumerate(zip(blocks, outs)):
        for layer, (w, b) in enumerate(head):
            t[f"blocks.{k}.layers.{layer}.weight"] = _cpu(w).clone()     # safetensors refuses shared storage
            t[f"blocks.{k}.layers.{layer}.bias"] = _cpu(b).clone()
        t[f"lm_heads.{k}.weight"] = _cpu(out).clone() if reduced else _target_order(out, d2t)
    if reduced:
        t["token_map"] = _cpu(d2t).long()
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": int(c.hidden_size),
           "vocab_size": int(c.target_vocab_size), "num_heads": len(outs), "num_hidden_layers": len(blocks[0]),
           "truncated_vocab_size": int(d2t.numel()), "medusa_fc_bias": True}
    return t, cfg


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
        fmt: one of `EXPORT_FORMATS` (``vllm-medusa``: vLLM's Medusa layout, the
            others the reference code's).
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
    if family != _FAMILY[fmt]:
        raise ValueError(f"a{'n' if family[0] == 'e' else ''} {family} head cannot be written in the {fmt} format"
                         + (f" (export it as {family})" if family in EXPORT_FORMATS else ""))
    tensors, cfg = {"eagle": _eagle_tensors, "eagle3": _eagle3_tensors, "medusa": _medusa_tensors,
                    "vllm-medusa": _vllm_medusa_tensors}[fmt](drafter, target)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    if fmt == "medusa":
        torch.save(tensors, folder / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def vllm_notes(folder: str | Path, fmt: str) -> list[str]:
    """Why vLLM's method for ``fmt`` (at `VLLM_COMMIT`, module docstring) would not run
    the head in ``folder`` (written by `export_published`) exactly; [] when it would.

    Returns:
        One-line reasons (fc bias, own embeddings, ``norm_before_residual``, other
        EAGLE-3 target layers, the reference Medusa layout).

    Raises:
        FileNotFoundError: ``folder`` lacks config.json or its weights file.
    """
    from specloop.realmodels.heads.published_files import read_config, read_tensors
    folder = Path(folder)
    cfg = read_config(folder, fmt)
    if fmt == "medusa":
        return ["vLLM's medusa method reads blocks.*/lm_heads.* from *.safetensors or *.bin with model_type "
                "medusa, not medusa_lm_head.pt: export with --format vllm-medusa for vLLM"]
    if fmt not in ("eagle", "eagle3"):
        return []
    names = set(read_tensors(folder, fmt, ("model.safetensors",)))
    notes = []
    if "fc.bias" in names:
        notes.append("vLLM's eagle method builds fc without a bias (fc.bias does not load; \"bias\": true also "
                     "gives its o_proj a bias): only a \"bias\": false head runs there exactly")
    if "embed_tokens.weight" in names:
        notes.append(f"vLLM's {fmt} method uses the target's embeddings, not the head's own embed_tokens.weight")
    if fmt == "eagle3" and cfg.get("norm_before_residual"):
        notes.append("vLLM's eagle3 method (at the pinned commit) does not read norm_before_residual")
    if fmt == "eagle3" and (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"):
        notes.append("vLLM's eagle3 method (at the pinned commit) fuses target layers (2, L//2, L-3) whatever "
                     "the config's eagle_aux_hidden_state_layer_ids say")
    return notes
