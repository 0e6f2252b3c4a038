"""Load published Hydra checkpoints (``hydra:PATH``) as specloop drafters.

Format, as read from the reference code (zankner/Hydra ``hydra/model/hydra_model.py``,
``hydra/model/hydra_heads/mlp_head.py``, ``hydra/train/train.py``, commit 3f39fbd;
Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft Heads for Medusa Decoding"):

* ``config.json``: ``hydra_num_heads`` K, ``hydra_num_layers`` L (>= 1),
  ``hydra_head_arch`` (only ``"mlp"`` is loaded here; ``prefix-mlp``, ``cross-attn``
  and ``eagle-attn`` -- Hydra++'s -- are refused by name), ``grounded_heads``,
  ``hidden_state_offset`` (0 = the target's last hidden state after the final norm;
  o > 0 = HF ``hidden_states[-(o+1)]``).
* ``hydra_lm_head.pt``: the ``HydraMLP`` state dict. ResBlock(x) = res(x) + SiLU(W x + b)
  with res the identity, or a ``Linear`` for a block whose input is wider than H.
  - grounded: head k (0-based) reads u_k = [h_t; E(x_{t+1}); E(d_1); ...; E(d_k)]
    ((k+2) H wide; x_{t+1} the pending token, d_j the draft tokens of depths < k): its
    first block ``hydra_mlp.{k}.0.{linear,res_connection}.{weight,bias}`` maps (k+2) H
    -> H, then ``[ResBlock(H)] * (L-1)``, one tied block applied L-1 times (keys
    ``hydra_mlp.{k}.{l}.linear.*``, l = 1..L-1; ``load_state_dict`` leaves it with the
    last key's tensors, as done here).
  - not grounded: head k reads h_t only through ``[ResBlock(H)] * L`` (one tied block
    applied L times, keys ``hydra_mlp.{k}.{l}.linear.*``): Medusa with a biased LM head.
  - ``hydra_lm_head.{k}.{weight,bias}`` [V, H] / [V]: head k's own LM head (with bias).
  - optional ``input_embed_fn.weight`` [V, H]: the reference registers the target's
    embedding module inside the heads, so it is saved with them (frozen, equal to the
    target's) and loaded back over it; used as E when present, else the target's.

Head k predicts x_{t+2+k}, the same depth convention as `HydraDrafter`. The reference
loads with ``strict=False``; here every key must be present and none extra.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from specloop.realmodels.heads.head_drafting import FeatureHeadDrafter
from specloop.realmodels.heads.published_files import (IdentityVocab, no_leftovers, read_config, read_tensors,
                                                       require_equal, take, target_shapes, resolve_checkpoint)

__all__ = ["PublishedHydraHeads", "PublishedHydraDrafter", "load_published_hydra", "HYDRA_ARCHS_REFUSED"]

HYDRA_ARCHS_REFUSED = ("prefix-mlp", "cross-attn", "eagle-attn")


class PublishedHydraHeads(nn.Module):
    """K published Hydra ``mlp`` heads (see the module docstring for the maths).

    Args:
        num_heads: K; num_layers: L >= 1; hidden_size: H; vocab: V.
        grounded: whether head k reads the embeddings of the pending and earlier draft
            tokens (Hydra) or h_t only (ungrounded, Medusa-like).
        embed_weight: [V, H] token embeddings E (kept as a non-trainable buffer).

    Attributes:
        first: head k's first block ``Linear((k+2) H, H)`` (grounded) or its tied block.
        first_res: grounded: head k's ``res_connection`` ``Linear((k+2) H, H)``.
        tied: grounded: head k's tied block ``Linear(H, H)`` applied L-1 times.
        outs: head k's ``Linear(H, V)`` with bias.
    """

    def __init__(self, num_heads: int, num_layers: int, hidden_size: int, vocab: int, *, grounded: bool,
                 embed_weight: torch.Tensor) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_heads=num_heads, num_layers=num_layers, hidden_size=hidden_size,
                                      target_vocab_size=vocab, grounded=bool(grounded))
        hsz = hidden_size
        width = [(k + 2) * hsz if grounded else hsz for k in range(num_heads)]
        self.first = nn.ModuleList(nn.Linear(w, hsz) for w in width)
        self.first_res = nn.ModuleList(nn.Linear(w, hsz) for w in width) if grounded else None
        self.tied = nn.ModuleList(nn.Linear(hsz, hsz) for _ in range(num_heads)) if grounded and num_layers > 1 \
            else None
        self.outs = nn.ModuleList(nn.Linear(hsz, vocab) for _ in range(num_heads))
        self.register_buffer("embed_weight", embed_weight.detach().clone(), persistent=False)
        self.lm_head = IdentityVocab(vocab, self.outs[0])

    def head_features(self, u: torch.Tensor, depth: int) -> torch.Tensor:
        """Head ``depth``'s MLP on its input u: (B, (depth+2) H) grounded, (B, H) not
        -> (B, H)."""
        c = self.config
        x = u.to(self.outs[depth].weight.dtype)
        if c.grounded:
            x = self.first_res[depth](x) + F.silu(self.first[depth](x))
            for _ in range(c.num_layers - 1):
                x = x + F.silu(self.tied[depth](x))
            return x
        for _ in range(c.num_layers):
            x = x + F.silu(self.first[depth](x))
        return x

    def step(self, depth: int, states: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft depth for a batch of nodes.

        Args:
            depth: head index k in [0, K).
            states: grounded: (B, (k+1) H) = [h_t; E(x_{t+1}); ...; E(d_{k-1})] without
                the node's own token; else (B, H) = h_t.
            tokens: (B,) int64 target id of each node's token (x_{t+1} at depth 0).

        Returns:
            (states, logits): the input extended by E(tokens) (grounded; unchanged
            otherwise) and (B, V) logits of head k.

        Raises:
            ValueError: depth outside [0, K).
        """
        if not 0 <= depth < self.config.num_heads:
            raise ValueError(f"Hydra head depth {depth} outside [0, {self.config.num_heads})")
        dtype = self.outs[depth].weight.dtype
        states = states.to(dtype)
        if self.config.grounded:
            emb = F.embedding(tokens.long().to(self.embed_weight.device), self.embed_weight).to(dtype)
            states = torch.cat([states, emb], -1)
        return states, self.outs[depth](self.head_features(states, depth))

    def trainable_parameters(self) -> list[torch.Tensor]:
        """The tensors online learners update (the embedding is not one)."""
        return list(self.parameters())


class PublishedHydraDrafter(FeatureHeadDrafter):
    """`PublishedHydraHeads` behind the Drafter interface (chain and trees, greedy and
    sampling, online updates as `FeatureHeadDrafter`). ``needs_target_hidden`` is
    (-1,), or (-(o+1),) for a checkpoint's ``hidden_state_offset`` o."""

    name = "hydra"

    def __init__(self, heads: PublishedHydraHeads, *, hidden_state_offset: int = 0) -> None:
        super().__init__(heads)
        self.needs_target_hidden = (-(int(hidden_state_offset) + 1),)

    def expand(self, states: torch.Tensor, tokens: torch.Tensor, depth: int):
        return self.heads.step(depth, states, tokens)


def _hydra_settings(cfg: dict, num_target_layers: int) -> tuple[int, int, bool, int]:
    arch = str(cfg.get("hydra_head_arch", "mlp"))
    if arch != "mlp":
        known = " (Hydra++'s heads)" if arch in HYDRA_ARCHS_REFUSED else ""
        raise ValueError(f"hydra checkpoint's hydra_head_arch {arch!r}{known} is not supported: only 'mlp' heads "
                         f"load here (refused: {', '.join(HYDRA_ARCHS_REFUSED)})")
    num_heads, num_layers = int(cfg.get("hydra_num_heads", 0)), int(cfg.get("hydra_num_layers", 1))
    if num_heads < 1 or num_layers < 1:
        raise ValueError(f"hydra config needs hydra_num_heads >= 1 and hydra_num_layers >= 1, got "
                         f"{num_heads} and {num_layers}")
    offset = int(cfg.get("hidden_state_offset", 0) or 0)
    if not 0 <= offset <= num_target_layers:
        raise ValueError(f"hydra checkpoint's hidden_state_offset {offset} is outside [0, {num_target_layers}] "
                         "(the target's layer count)")
    return num_heads, num_layers, bool(cfg.get("grounded_heads", False)), offset


def _copy_linear(lin: nn.Linear, tensors: dict, prefix: str) -> None:
    out_f, in_f = lin.weight.shape
    lin.weight.copy_(take(tensors, f"{prefix}.weight", (out_f, in_f), "hydra"))
    lin.bias.copy_(take(tensors, f"{prefix}.bias", (out_f,), "hydra"))


def load_published_hydra(target, path: str | Path, *, dtype=None) -> PublishedHydraDrafter:
    """Hydra (``mlp`` heads) drafter from a published checkpoint directory for ``target``
    (a `LoadedModel`).

    Raises:
        FileNotFoundError: missing config / ``hydra_lm_head.pt``.
        ValueError: a head architecture other than ``mlp`` (named), hidden size or
            vocabulary differing from the target's (both named), a bad offset, or
            tensors of the wrong shape / not in the format.
    """
    kind = "hydra"
    folder = resolve_checkpoint(str(path), kind)
    cfg = read_config(folder, kind)
    hsz, vocab, layers = target_shapes(target.model)
    num_heads, num_layers, grounded, offset = _hydra_settings(cfg, layers)
    tensors = read_tensors(folder, kind, ("hydra_lm_head.pt", "hydra_lm_head.safetensors"))
    if "hydra_lm_head.0.weight" in tensors:
        require_equal("hidden size", int(tensors["hydra_lm_head.0.weight"].shape[1]), hsz, kind)
        require_equal("vocabulary", int(tensors["hydra_lm_head.0.weight"].shape[0]), vocab, kind)
    embed = target.model.get_input_embeddings().weight.detach().float().cpu()
    if "input_embed_fn.weight" in tensors:
        embed = take(tensors, "input_embed_fn.weight", tuple(embed.shape), kind)
    heads = PublishedHydraHeads(num_heads, num_layers, hsz, vocab, grounded=grounded, embed_weight=embed)
    with torch.no_grad():
        for k in range(num_heads):
            if grounded:
                _copy_linear(heads.first[k], tensors, f"hydra_mlp.{k}.0.linear")
                _copy_linear(heads.first_res[k], tensors, f"hydra_mlp.{k}.0.res_connection")
                for layer in range(1, num_layers):        # tied block: the last key's tensors win
                    _copy_linear(heads.tied[k], tensors, f"hydra_mlp.{k}.{layer}.linear")
            else:
                for layer in range(num_layers):
                    _copy_linear(heads.first[k], tensors, f"hydra_mlp.{k}.{layer}.linear")
            _copy_linear(heads.outs[k], tensors, f"hydra_lm_head.{k}")
    no_leftovers(tensors, kind)
    heads = heads.to(next(target.model.parameters()).device)
    if dtype is not None:
        from specloop.realmodels.loading import resolve_dtype
        heads = heads.to(resolve_dtype(dtype))
    drafter = PublishedHydraDrafter(heads.eval(), hidden_state_offset=offset)
    drafter.train_report = {"checkpoint": str(folder), "format": kind}
    return drafter
