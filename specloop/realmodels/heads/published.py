"""Load published draft checkpoints (EAGLE-1/2, EAGLE-3, Medusa; Hydra in
`specloop.realmodels.heads.published_hydra`) as specloop drafters.

Formats, as read from the reference code (SafeAILab/EAGLE ``eagle/model/cnets1.py``,
``cnets.py``, ``ea_model.py``; vLLM ``llama_eagle.py``, ``llama_eagle3.py``,
``medusa.py``; FasterDecoding/Medusa ``medusa/model/medusa_model.py``):

* **EAGLE-1/2** (Li et al. 2024): ``config.json`` (Llama fields, ``num_hidden_layers``
  1, optional ``bias`` for ``fc``, default true; optional ``qkv_bias``) + weights
  ``fc.{weight,bias}`` [H, 2H], ``layers.0.self_attn.{q,k,v,o}_proj``,
  ``layers.0.mlp.{gate,up,down}_proj``, ``layers.0.post_attention_layernorm`` and
  optional ``embed_tokens.weight`` (else the target's). Position i reads
  x_i = fc([emb(t_{i+1}); f_i]) (f = the target's last hidden state after the final
  norm; no norm on either half), one decoder layer *without* ``input_layernorm``
  (residual x_i), logits = the target's LM head on h_i (no final norm). The two
  references differ: vLLM's ``llama_eagle.py`` builds ``fc`` without a bias (only
  ``"bias": false`` checkpoints load there), allows more layers (input_layernorm
  from layer 1 on) and always shares the target's embeddings; EAGLE's ``ea_model``
  lets a checkpoint's ``embed_tokens`` override the target's (followed here); one
  layer only is accepted here.
* **EAGLE-3** (Li et al. 2025): ``fc.weight`` [H, 3 H_t] over the hidden states
  entering target layers (2, L//2, L-3) (or ``eagle_config.eagle_aux_hidden_state_layer_ids``,
  vLLM), concatenated low to high; one layer ``midlayer.*`` whose q/k/v read
  [input_layernorm(emb); hidden_norm(g)] (2H) with residual g = fc(features) (or
  hidden_norm(g) with vLLM's ``norm_before_residual``); logits = ``lm_head``
  (norm(h)) over ``draft_vocab_size`` rows, target id = draft id + ``d2t``[draft id];
  ``t2d`` (bool [V]) marks the target ids in the draft vocabulary.
* **Medusa** (Cai et al. 2024): ``config.json`` (``medusa_num_heads`` K,
  ``medusa_num_layers`` L) + ``medusa_lm_head.pt``; head k = ResBlock x L then
  ``Linear(H, V, bias=False)``, ResBlock(x) = x + SiLU(W x + b), keys
  ``{k}.{l}.linear.{weight,bias}`` and ``{k}.{L}.weight``. The reference builds
  ``[ResBlock(H)] * L``: one block applied L times, so its ``load_state_dict`` leaves
  the block with the last key's tensors (``{k}.{L-1}.linear``); the same is done here.

RoPE: an EAGLE / EAGLE-3 config's ``rope_theta`` and ``rope_scaling`` (``linear``, as
EAGLE's reference implements it, and ``llama3``, as vLLM does) set the head's rotary
frequencies (`rope_inv_freq`); other scaling types are refused by name.

The EAGLE heads are `EagleHead` subclasses (so `EagleDrafter` drafts chain and trees,
greedy and sampling, and online learners train them like specloop's own heads);
Medusa heads run behind `MedusaDrafter`. Every loader checks the checkpoint against
the target (hidden size, vocabulary, EAGLE-3 layer indices) and raises a one-line
``ValueError`` naming both values on a mismatch.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specloop.realmodels.drafters.options import ContextOptions
from specloop.realmodels.heads.common import ReducedVocab
from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
from specloop.realmodels.heads.eagle3_arch import PublishedArchEagle3Head
from specloop.realmodels.heads.eagle_drafter import EagleDrafter
from specloop.realmodels.heads.published_files import (IdentityVocab, no_leftovers, read_config,
                                                       read_tensors, require_equal, take, target_shapes,
                                                       resolve_checkpoint)

__all__ = ["PublishedEagleHead", "PublishedEagle3Head", "PublishedMedusaHeads", "resolve_checkpoint",
           "load_published_eagle", "load_published_eagle3", "load_published_medusa", "PUBLISHED_KINDS",
           "make_published_drafter", "rope_inv_freq", "PublishedOptions"]

PUBLISHED_KINDS = ("eagle", "eagle3", "medusa", "hydra")
def _rope_settings(cfg: dict) -> tuple[float, dict]:
    """(rope_theta, scaling dict or {}) of a checkpoint config: ``rope_scaling``
    (transformers 4.x files) or ``rope_parameters`` (5.x files)."""
    params = dict(cfg.get("rope_parameters") or {})
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = dict(cfg.get("rope_scaling") or {}) or params
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return theta, ({} if rope_type == "default" else {**scaling, "rope_type": rope_type})


def rope_inv_freq(cfg: dict, head_dim: int, kind: str) -> torch.Tensor | None:
    """The rotary frequencies [head_dim / 2] float32 of a checkpoint's ``rope_scaling``,
    or None for plain RoPE (theta^(-2i/d)). ``linear`` (EAGLE's reference
    ``LlamaLinearScalingRotaryEmbedding``: positions / factor, i.e. frequencies /
    factor) and ``llama3`` (Llama 3.1's wavelength-banded scaling, as vLLM and
    transformers apply it) are implemented.

    Raises:
        ValueError: any other type (``dynamic`` NTK depends on the sequence length,
            ``yarn`` / ``longrope`` also rescale attention), named.
    """
    theta, scaling = _rope_settings(cfg)
    if not scaling:
        return None
    rope_type = scaling["rope_type"]
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = float(scaling.get("factor", 1.0))
    if rope_type == "linear":
        return inv / factor
    if rope_type == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"{kind} checkpoint uses rope_scaling type {rope_type!r}, which specloop's head does not "
                     "implement (supported: linear, llama3)")


def _eagle_config(cfg: dict, kind: str, draft_vocab: int, vocab: int, layers: tuple[int, ...]) -> EagleConfig:
    hsz, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return EagleConfig(kind, hsz, heads, int(cfg.get("num_key_value_heads") or heads),
                       int(cfg.get("head_dim") or hsz // heads), int(cfg["intermediate_size"]),
                       float(cfg.get("rms_norm_eps", 1e-6)), _rope_settings(cfg)[0],
                       draft_vocab, vocab, layers, "published" if kind == "eagle3" else "specloop")


class _ScaledRope:
    """Mixin for `EagleHead` subclasses: rotary embedding with given frequencies
    (``rope_inv_freq`` buffer, [head_dim / 2]) when a checkpoint scales RoPE."""

    rope_inv_freq: torch.Tensor | None

    def set_rope(self, inv_freq: torch.Tensor | None) -> None:
        """Use ``inv_freq`` (None: the plain RoPE of the config's theta)."""
        self.register_buffer("rope_inv_freq", None if inv_freq is None else inv_freq.float(), persistent=False)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x [..., T, head_dim] at int positions [T] (Llama halves)."""
        if self.rope_inv_freq is None:
            return super().rotate(x, positions)
        ang = positions.to(torch.float32)[:, None] * self.rope_inv_freq.float()[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _load_layer(head: EagleHead, tensors: dict, prefix: str, in_width: int, kind: str) -> None:
    """Copy attention, MLP and post-attention norm of decoder layer ``prefix``."""
    c = head.config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"self_attn.q_proj": (q, in_width), "self_attn.k_proj": (kv, in_width),
              "self_attn.v_proj": (kv, in_width), "self_attn.o_proj": (c.hidden_size, q),
              "mlp.gate_proj": (c.intermediate_size, c.hidden_size), "mlp.up_proj": (c.intermediate_size, c.hidden_size),
              "mlp.down_proj": (c.hidden_size, c.intermediate_size)}
    with torch.no_grad():
        for name, shape in shapes.items():
            lin = getattr(head, name.split(".")[1])
            lin.weight.copy_(take(tensors, f"{prefix}{name}.weight", shape, kind))
            if lin.bias is not None:
                lin.bias.copy_(take(tensors, f"{prefix}{name}.bias", shape[:1], kind))
        head.post_norm.weight.copy_(take(tensors, f"{prefix}post_attention_layernorm.weight", (c.hidden_size,), kind))


def _embeddings(tensors: dict, model, kind: str) -> torch.Tensor:
    """The checkpoint's ``embed_tokens.weight`` when present (it overrides the target's
    in the reference loaders), else the target's input embeddings."""
    target = model.get_input_embeddings().weight.detach().float().cpu()
    if "embed_tokens.weight" in tensors:
        return take(tensors, "embed_tokens.weight", tuple(target.shape), kind)
    return target


def _with_bias(lin: nn.Linear, bias: bool) -> nn.Linear:
    return lin if (lin.bias is not None) == bias else nn.Linear(lin.in_features, lin.out_features, bias=bias)


# --------------------------------------------------------------------------- EAGLE-1/2
class PublishedEagleHead(_ScaledRope, EagleHead):
    """EAGLE-1/2's published head: ``fuse`` = the checkpoint's ``fc`` (bias per the
    config), no norms on the fused halves, no ``input_layernorm``, logits = the
    target's full LM head (V_draft = V_target). Shapes and methods as `EagleHead`.

    Args:
        config: ``kind="eagle"``, draft_vocab_size == target_vocab_size.
        embed_weight: [V, H] input embeddings; lm_weight: [V, H] the target's LM head.
        fc_bias, qkv_bias: whether ``fc`` / q,k,v projections carry a bias.
    """

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, lm_weight: torch.Tensor, *,
                 fc_bias: bool = True, qkv_bias: bool = False, rope_inv_freq: torch.Tensor | None = None) -> None:
        super().__init__(config, embed_weight, lm_weight)
        self.set_rope(rope_inv_freq)
        self.norm_emb = nn.Identity()
        self.norm_feat = nn.Identity()
        self.input_norm = nn.Identity()
        self.fuse = _with_bias(self.fuse, fc_bias)
        for name in ("q_proj", "k_proj", "v_proj"):
            setattr(self, name, _with_bias(getattr(self, name), qkv_bias))


def load_published_eagle(target, path: str | Path, *, dtype=None) -> EagleDrafter:
    """EAGLE-1/2 drafter from a published checkpoint directory for ``target`` (a
    `LoadedModel`; transformers Llama-style model).

    Raises:
        FileNotFoundError: missing config / weights.
        ValueError: hidden size or vocabulary differ from the target's (both named),
            a layer count other than 1, an unsupported rope_scaling type, or tensors of the wrong shape /
            not in the format.
    """
    kind = "eagle"
    folder = resolve_checkpoint(str(path), kind)
    cfg = read_config(folder, kind)
    tensors = read_tensors(folder, kind, ("model.safetensors", "pytorch_model.bin"))
    hsz, vocab, _ = target_shapes(target.model)
    require_equal("hidden_size", int(cfg["hidden_size"]), hsz, kind)
    require_equal("vocab_size", int(cfg["vocab_size"]), vocab, kind)
    require_equal("num_hidden_layers", int(cfg.get("num_hidden_layers", 1)), 1, kind)
    if any(k.startswith("layers.0.input_layernorm") for k in tensors):
        raise ValueError("eagle checkpoint has layers.0.input_layernorm, which EAGLE-1/2's first layer does not have")
    config = _eagle_config(cfg, kind, vocab, vocab, (-1,))
    embed = _embeddings(tensors, target.model, kind)
    lm = target.model.get_output_embeddings().weight.detach().float().cpu()
    head = PublishedEagleHead(config, embed, lm, fc_bias=bool(cfg.get("bias", True)),
                              qkv_bias=bool(cfg.get("qkv_bias", False)),
                              rope_inv_freq=rope_inv_freq(cfg, config.head_dim, kind))
    with torch.no_grad():
        head.fuse.weight.copy_(take(tensors, "fc.weight", (hsz, 2 * hsz), kind))
        if head.fuse.bias is not None:
            head.fuse.bias.copy_(take(tensors, "fc.bias", (hsz,), kind))
    _load_layer(head, tensors, "layers.0.", hsz, kind)
    no_leftovers(tensors, kind)
    head.published_config = dict(cfg)          # what `published_export` writes back
    return _eagle_drafter(head, ReducedVocab(torch.arange(vocab), vocab), "eagle", target, dtype, folder)


def _eagle_drafter(head: EagleHead, vocab: ReducedVocab, name: str, target, dtype, folder: Path) -> EagleDrafter:
    head = head.to(next(target.model.parameters()).device)
    if dtype is not None:
        from specloop.realmodels.loading import resolve_dtype
        head = head.to(resolve_dtype(dtype))
    drafter = EagleDrafter(head.eval(), vocab, name=name)
    drafter.train_report = {"checkpoint": str(folder), "format": name}
    return drafter


# --------------------------------------------------------------------------- EAGLE-3
class PublishedEagle3Head(_ScaledRope, PublishedArchEagle3Head):
    """EAGLE-3's published head as a checkpoint defines it: the layer of
    `specloop.realmodels.heads.eagle3_arch.PublishedArchEagle3Head` (x = [input_layernorm(emb(t));
    g] [..., 2H], q/k/v over [input_layernorm(emb); hidden_norm(g)], residual g, or
    hidden_norm(g) with ``norm_before_residual``; logits = lm_head(norm(h)) over V_draft)
    with the checkpoint's RoPE scaling. ``norm_emb`` is the checkpoint's
    ``input_layernorm``, ``input_norm.hidden_norm`` its ``hidden_norm``.

    Args:
        config: ``kind="eagle3"``, ``arch="published"``; embed_weight [V, H]; lm_weight
            [V_draft, H] (the checkpoint's ``lm_head``, trainable).
        target_hidden_size: H_t, width of each of the three target features.
        norm_before_residual: vLLM's option (default False, as the reference).
        rope_inv_freq: [head_dim / 2] float32 rotary frequencies (`rope_inv_freq`), or
            None for plain RoPE.
    """

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, lm_weight: torch.Tensor, *,
                 target_hidden_size: int, norm_before_residual: bool = False,
                 rope_inv_freq: torch.Tensor | None = None) -> None:
        super().__init__(config, embed_weight, lm_weight, target_hidden_size=target_hidden_size,
                         norm_before_residual=norm_before_residual)
        self.set_rope(rope_inv_freq)


def eagle3_layer_ids(cfg: dict, num_layers: int) -> tuple[int, int, int]:
    """Target layers whose *input* hidden states EAGLE-3 fuses (HF ``hidden_states``
    indices): ``eagle_config.eagle_aux_hidden_state_layer_ids`` if the config has
    them (vLLM), else (2, L//2, L-3) (EAGLE's ``modeling_llama_kv``).

    Raises:
        ValueError: indices outside the target's L layers, or not three distinct
            increasing ones (the reference collects each layer once, in order).
    """
    given = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    ids = tuple(int(i) for i in given) if given else (2, num_layers // 2, num_layers - 3)
    if len(ids) != 3 or not all(0 <= i < num_layers for i in ids):
        raise ValueError(f"eagle3 checkpoint reads target layers {ids}, the target has {num_layers} layers")
    if not ids[0] < ids[1] < ids[2]:
        raise ValueError(f"eagle3 layer indices {ids} for a target of {num_layers} layers are not distinct and "
                         "increasing (EAGLE-3 needs at least 7 target layers)")
    return ids


def _eagle3_vocab(tensors: dict, draft_vocab: int, vocab: int) -> ReducedVocab:
    """Absolute target ids of the draft rows from ``d2t`` offsets; ``t2d`` checked."""
    if "d2t" not in tensors:
        if draft_vocab != vocab:
            raise ValueError(f"eagle3 checkpoint has draft_vocab_size {draft_vocab} < vocab_size {vocab} but no d2t")
        tensors.pop("t2d", None)
        return ReducedVocab(torch.arange(vocab), vocab)
    d2t = torch.arange(draft_vocab) + take(tensors, "d2t", (draft_vocab,), "eagle3").long()
    if int(d2t.min()) < 0 or int(d2t.max()) >= vocab or torch.unique(d2t).numel() != draft_vocab:
        raise ValueError(f"eagle3 checkpoint's d2t maps draft ids outside [0, {vocab}) or onto repeated target ids")
    if "t2d" in tensors:
        t2d = take(tensors, "t2d", (vocab,), "eagle3").bool()
        marked = torch.zeros(vocab, dtype=torch.bool)
        marked[d2t] = True
        if not torch.equal(t2d, marked):
            raise ValueError("eagle3 checkpoint's t2d does not mark exactly the target ids d2t maps to")
    return ReducedVocab(d2t, vocab)


def load_published_eagle3(target, path: str | Path, *, dtype=None) -> EagleDrafter:
    """EAGLE-3 drafter from a published checkpoint directory for ``target``.

    Raises:
        FileNotFoundError: missing config / weights.
        ValueError: hidden size, target_hidden_size, vocabulary or layer indices
            that do not fit the target (both values named), an unsupported
            rope_scaling type, an
            inconsistent d2t/t2d, tensors of the wrong shape / not in the format.
    """
    kind = "eagle3"
    folder = resolve_checkpoint(str(path), kind)
    cfg = read_config(folder, kind)
    tensors = read_tensors(folder, kind, ("model.safetensors", "pytorch_model.bin"))
    hsz, vocab, layers = target_shapes(target.model)
    require_equal("hidden_size", int(cfg["hidden_size"]), hsz, kind)
    require_equal("target_hidden_size", int(cfg.get("target_hidden_size") or cfg["hidden_size"]), hsz, kind)
    require_equal("vocab_size", int(cfg["vocab_size"]), vocab, kind)
    ids = eagle3_layer_ids(cfg, layers)
    draft_vocab = int(cfg.get("draft_vocab_size") or vocab)
    reduced = _eagle3_vocab(tensors, draft_vocab, vocab)
    config = _eagle_config(cfg, kind, draft_vocab, vocab, ids)
    embed = _embeddings(tensors, target.model, kind)
    lm = take(tensors, "lm_head.weight", (draft_vocab, hsz), kind)
    head = PublishedEagle3Head(config, embed, lm, target_hidden_size=hsz,
                               norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                               rope_inv_freq=rope_inv_freq(cfg, config.head_dim, kind))
    with torch.no_grad():
        head.fc_feat.weight.copy_(take(tensors, "fc.weight", (hsz, 3 * hsz), kind))
        for key, norm in (("midlayer.input_layernorm.weight", head.norm_emb),
                          ("midlayer.hidden_norm.weight", head.input_norm.hidden_norm), ("norm.weight", head.out_norm)):
            norm.weight.copy_(take(tensors, key, (hsz,), kind))
    _load_layer(head, tensors, "midlayer.", 2 * hsz, kind)
    no_leftovers(tensors, kind)
    head.published_config = dict(cfg)
    return _eagle_drafter(head, reduced, "eagle3", target, dtype, folder)


# --------------------------------------------------------------------------- Medusa
class PublishedMedusaHeads(nn.Module):
    """K published Medusa heads: head k = (x + SiLU(W_k x + b_k)) applied L times
    (one tied block, as the reference builds it), then its own ``Linear(H, V)``.

    Attributes:
        config: object with ``num_heads`` (K), ``num_layers`` (L), ``hidden_size``,
            ``target_vocab_size``.
    """

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab: int) -> None:
        super().__init__()
        from types import SimpleNamespace
        self.config = SimpleNamespace(num_heads=num_heads, num_layers=num_layers, hidden_size=hidden_size,
                                      target_vocab_size=vocab)
        self.blocks = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        self.outs = nn.ModuleList(nn.Linear(hidden_size, vocab, bias=False) for _ in range(num_heads))
        self.lm_head = IdentityVocab(vocab, self.outs[0])

    def head_logits(self, h: torch.Tensor, depth: int) -> torch.Tensor:
        """(B, H) features -> (B, V) logits of head ``depth`` (0-based).

        Raises:
            ValueError: depth outside [0, K).
        """
        if not 0 <= depth < self.config.num_heads:
            raise ValueError(f"Medusa head depth {depth} outside [0, {self.config.num_heads})")
        x = h.to(self.outs[depth].weight.dtype)
        for _ in range(self.config.num_layers):
            x = x + F.silu(self.blocks[depth](x))
        return self.outs[depth](x)

    def trainable_parameters(self) -> list[torch.Tensor]:
        """The tensors online learners update (each tensor once)."""
        return list(self.parameters())


def load_published_medusa(target, path: str | Path, *, dtype=None):
    """Medusa drafter (`MedusaDrafter`) from a published checkpoint directory.

    Raises:
        FileNotFoundError: missing config / ``medusa_lm_head.pt``.
        ValueError: hidden size or vocabulary differ from the target's, or tensors
            of the wrong shape / not in the format.
    """
    from specloop.realmodels.heads.head_drafting import MedusaDrafter
    kind = "medusa"
    folder = resolve_checkpoint(str(path), kind)
    cfg = read_config(folder, kind)
    tensors = read_tensors(folder, kind, ("medusa_lm_head.pt", "medusa_lm_head.safetensors"))
    hsz, vocab, _ = target_shapes(target.model)
    num_heads, num_layers = int(cfg.get("medusa_num_heads", 0)), int(cfg.get("medusa_num_layers", 1))
    if num_heads < 1 or num_layers < 1:
        raise ValueError(f"medusa config needs medusa_num_heads >= 1 and medusa_num_layers >= 1, got "
                         f"{num_heads} and {num_layers}")
    if "0.0.linear.weight" in tensors:
        require_equal("hidden size", int(tensors["0.0.linear.weight"].shape[0]), hsz, kind)
    if f"0.{num_layers}.weight" in tensors:
        require_equal("vocabulary", int(tensors[f"0.{num_layers}.weight"].shape[0]), vocab, kind)
    heads = PublishedMedusaHeads(num_heads, num_layers, hsz, vocab)
    with torch.no_grad():
        for k in range(num_heads):
            for layer in range(num_layers):     # tied block: the last layer's tensors win, as in the reference
                heads.blocks[k].weight.copy_(take(tensors, f"{k}.{layer}.linear.weight", (hsz, hsz), kind))
                heads.blocks[k].bias.copy_(take(tensors, f"{k}.{layer}.linear.bias", (hsz,), kind))
            heads.outs[k].weight.copy_(take(tensors, f"{k}.{num_layers}.weight", (vocab, hsz), kind))
    no_leftovers(tensors, kind)
    heads.published_config = dict(cfg)
    heads = heads.to(next(target.model.parameters()).device)
    if dtype is not None:
        from specloop.realmodels.loading import resolve_dtype
        heads = heads.to(resolve_dtype(dtype))
    drafter = MedusaDrafter(heads.eval())
    drafter.train_report = {"checkpoint": str(folder), "format": kind}
    return drafter


# --------------------------------------------------------------------------- registry
def _load_hydra(target, path, *, dtype=None):
    from specloop.realmodels.heads.published_hydra import load_published_hydra
    return load_published_hydra(target, path, dtype=dtype)


_LOADERS = {"eagle": load_published_eagle, "eagle3": load_published_eagle3, "medusa": load_published_medusa,
            "hydra": _load_hydra}


@dataclasses.dataclass(frozen=True)
class PublishedOptions(ContextOptions):
    """Options of ``--draft KIND:PATH`` (`make_published_drafter`): the
    `ContextOptions`; ``dtype`` (None = the loader's default) is honoured, the others
    are ignored."""
    kind = "published"


def make_published_drafter(target, kind: str, path: str, **options):
    """Registry entry for ``--draft KIND:PATH`` (KIND in `PUBLISHED_KINDS`).

    Args:
        **options: the fields of `PublishedOptions` (only ``dtype`` is used).

    Raises:
        ValueError: unknown KIND, an option `PublishedOptions` does not declare or a
            wrong type; FileNotFoundError / ValueError from the loader.
    """
    if kind not in _LOADERS:
        raise ValueError(f"unknown published draft format {kind!r}: use one of {', '.join(PUBLISHED_KINDS)}")
    opts = PublishedOptions.from_options(options, drafter=f"{kind}:{path}")
    return _LOADERS[kind](target, path, dtype=opts.dtype)
