"""The two EAGLE-3 layers ``specloop draft train --kind eagle3 --arch {specloop,published}``
builds, and the ``config.json`` a published-layer head is served with.

* ``specloop`` (default; `EagleHead`): x = fuse([norm(emb(t)); norm(g)]) (2H -> H), the
  layer's q/k/v read input_norm(x) and its residual is x.
* ``published`` (`PublishedArchEagle3Head`): EAGLE-3's own layer (Li et al. 2025; as
  vLLM's ``llama_eagle3.py`` and SafeAILab EAGLE's ``cnets.py`` run it, layout described
  in `specloop.realmodels.heads.published`): g = fc([low; mid; high]) (3H -> H), q/k/v
  read [input_layernorm(emb(t)); hidden_norm(g)] (2H) and the residual is g; logits =
  lm_head(norm(h)) over the reduced vocabulary (``d2t`` / ``t2d``). At draft step s >= 2
  g is the head's own previous output h (pre-norm), as in the reference. Such a head
  is written exactly by ``specloop draft export --format eagle3`` (tensor names and
  shapes in `specloop.realmodels.heads.published_export`, the names vLLM's EAGLE-3
  method reads at the commit named there; read from its code, not run here) and loads
  back with ``--draft eagle3:DIR`` (`load_published_eagle3`).

Both are `EagleHead`s, so the trainer
(`specloop.realmodels.training.train_eagle`: training-time test over S steps) and the
drafter (`EagleDrafter`: chain, static and dynamic trees) run them unchanged; only
construction differs (`build_eagle_head`). ``EagleConfig.arch`` records the choice in
the saved ``draft.json`` so `eagle_drafter_from_saved` rebuilds the same layer.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specloop.realmodels.heads.eagle import EagleConfig, EagleHead, RMSNorm

__all__ = ["HEAD_ARCHS", "PublishedArchEagle3Head", "build_eagle_head", "published_eagle3_config"]

HEAD_ARCHS = ("specloop", "published")


class _HalfNorm(nn.Module):
    """[e; g] (2H) -> [e; hidden_norm(g)]: EAGLE-3's attention input from the head's
    layer input x = [input_layernorm(emb); g]."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(size, eps)
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[..., :self.size], self.hidden_norm(x[..., self.size:])], -1)


class PublishedArchEagle3Head(EagleHead):
    """EAGLE-3's published layer as an `EagleHead` (what ``--arch published`` trains;
    `specloop.realmodels.heads.published.PublishedEagle3Head` adds a checkpoint's RoPE
    scaling). The layer input is x = [input_layernorm(emb(t)); g] [..., 2H] (g =
    fc(features) at step 1, the head's own pre-norm output h after), q/k/v read
    [input_layernorm(emb); hidden_norm(g)] (``input_norm``) and the residual is g
    (hidden_norm(g) with ``norm_before_residual``); logits = lm_head(norm(h)) over V_draft.

    Tensors (H hidden size, H_t target hidden size, V_d draft vocabulary, nh / nkv / hd
    the attention shapes, I the MLP width; float32 unless moved): ``fc_feat`` [H, 3H_t]
    (the published ``fc``), ``norm_emb`` [H] (``input_layernorm``),
    ``input_norm.hidden_norm`` [H] (``hidden_norm``), ``q_proj`` [nh*hd, 2H], ``k_proj`` /
    ``v_proj`` [nkv*hd, 2H], ``o_proj`` [H, nh*hd], ``post_norm`` [H], ``gate_proj`` /
    ``up_proj`` [I, H], ``down_proj`` [H, I], ``out_norm`` [H] (``norm``), ``lm_head``
    [V_d, H] (trainable). Fresh initialisation as `EagleHead`'s: q/k/v and the MLP's
    gate / up normal(0, 0.02), o_proj and down_proj zero (the layer starts as the
    identity on g), fc normal with std 1/sqrt(3 H_t), norms one, lm_head = ``lm_rows``.

    Args:
        config: ``kind="eagle3"``, ``arch="published"``.
        embed_weight: [V_target, H] the target's input embeddings (never trained).
        lm_rows: [V_draft, H] initial LM-head rows (the target's rows of the reduced
            vocabulary, or a checkpoint's ``lm_head``).
        target_hidden_size: H_t (default H).
        norm_before_residual: vLLM's option (default False, as the reference).

    Raises:
        ValueError: another kind / arch, or tensors of the wrong shape.
    """

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, lm_rows: torch.Tensor, *,
                 target_hidden_size: int | None = None, norm_before_residual: bool = False) -> None:
        if config.kind != "eagle3" or config.arch != "published":
            raise ValueError(f"the published EAGLE-3 layer needs kind 'eagle3' and arch 'published', got "
                             f"{config.kind!r} / {config.arch!r}")
        super().__init__(config, embed_weight, lm_rows)
        c = config
        hsz, width = c.hidden_size, 2 * c.hidden_size
        feat = int(target_hidden_size or hsz)
        self.fc_feat = nn.Linear(3 * feat, hsz, bias=False)
        self.fuse = None
        self.norm_feat = None
        self.input_norm = _HalfNorm(hsz, c.rms_norm_eps)
        self.q_proj = nn.Linear(width, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(width, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(width, c.num_kv_heads * c.head_dim, bias=False)
        self.norm_before_residual = bool(norm_before_residual)
        with torch.no_grad():
            for lin in (self.q_proj, self.k_proj, self.v_proj):
                nn.init.normal_(lin.weight, std=0.02)
            nn.init.normal_(self.fc_feat.weight, std=1.0 / math.sqrt(3 * feat))

    def embed_input(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """x = [input_layernorm(emb(tokens)); feats] [..., T, 2H]; tokens int [..., T]
        target ids, feats [..., T, H] (g)."""
        emb = F.embedding(tokens.long(), self.embed_weight).to(feats.dtype)
        return torch.cat([self.norm_emb(emb), feats], -1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual g (the second half of x [B, T, 2H]) + o_proj(attn), then the MLP;
        returns h [B, T, H]."""
        g = x[..., self.config.hidden_size:]
        return super().finish(self.input_norm.hidden_norm(g) if self.norm_before_residual else g, attn)


def build_eagle_head(config: EagleConfig, embed_weight: torch.Tensor, lm_rows: torch.Tensor) -> EagleHead:
    """The fresh head ``config`` describes: `PublishedArchEagle3Head` for
    ``arch="published"``, else `EagleHead` (arguments as `EagleHead`'s).

    Raises:
        ValueError: tensors of the wrong shape (from the constructors).
    """
    if config.arch == "published":
        return PublishedArchEagle3Head(config, embed_weight, lm_rows)
    return EagleHead(config, embed_weight, lm_rows)


def published_eagle3_config(config: EagleConfig, target_config) -> dict:
    """``config.json`` fields of a published-layer head trained by specloop (the
    Llama fields vLLM's and specloop's EAGLE-3 loaders read; ``model_type`` and
    ``architectures`` are added by the exporter).

    Args:
        config: the head's `EagleConfig` (``arch="published"``).
        target_config: the target's transformers config (``max_position_embeddings``,
            ``num_hidden_layers``, token ids).

    Returns:
        A JSON-able dict: shapes, ``rms_norm_eps``, ``rope_theta`` (plain RoPE: the
        head was trained without the target's ``rope_scaling``, so none is written),
        ``vocab_size``, ``draft_vocab_size``, ``target_hidden_size``,
        ``num_hidden_layers`` 1, and ``eagle_config.eagle_aux_hidden_state_layer_ids``
        only when the fused layers are not EAGLE-3's default (2, L//2, L-3).

    Raises:
        ValueError: a head that is not of the published layout.
    """
    if config.kind != "eagle3" or config.arch != "published":
        raise ValueError(f"only an eagle3 head of arch 'published' has a published config, got "
                         f"{config.kind!r} / {config.arch!r}")
    layers = int(target_config.num_hidden_layers)
    out = {"hidden_size": config.hidden_size, "target_hidden_size": config.hidden_size,
           "intermediate_size": config.intermediate_size, "num_attention_heads": config.num_heads,
           "num_key_value_heads": config.num_kv_heads, "head_dim": config.head_dim, "num_hidden_layers": 1,
           "hidden_act": "silu", "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
           "rope_scaling": None, "max_position_embeddings": int(getattr(target_config, "max_position_embeddings",
                                                                        2048)),
           "vocab_size": config.target_vocab_size, "draft_vocab_size": config.draft_vocab_size,
           "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(target_config, key, None) is not None:
            out[key] = getattr(target_config, key)
    if tuple(config.feature_layers) != (2, layers // 2, layers - 3):
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(config.feature_layers)}
    return out
