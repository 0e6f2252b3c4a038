"""EAGLE-style draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires
Rethinking Feature Uncertainty"), with EAGLE-3's fused features and training-time
test (Li et al. 2025, "EAGLE-3") as options.

One decoder layer (RMSNorm, rotary grouped-query attention, SwiGLU MLP, shapes
copied from the target) over the target's features and token embeddings:

    position i input   x_i = fuse([norm(emb(t_{i+1})) ; norm(g(feature_i))])        (2H -> H)
    output             h_i = layer(x_<=i)                                              (H)
    draft logits       z_i = lm_head(h_i)           over the reduced vocabulary V_draft

* ``kind="eagle"``: feature_i = the target's last-layer hidden state f_i (post final
  norm, what the target's LM head reads), g = identity; ``lm_head`` = the target's LM
  head rows of the reduced vocabulary, frozen (EAGLE uses the target's LM head), and
  h_i is also regressed onto f_{i+1} (EAGLE's feature loss).
* ``kind="eagle3"``: feature_i = [low; mid; high] target layers (hidden_states
  indices 2, L//2, L-3), g = a trainable 3H -> H projection; ``lm_head`` is trainable
  (initialised from the target's rows) behind a final RMSNorm.

Multi-step drafting feeds the head its own output: at draft step s >= 2 the
feature input at position i is h^{(s-1)}_{i-1}. `EagleHead.forward_ttt` trains all
steps at once with EAGLE-3's training-time-test attention: step s at position i
attends to step-1 keys at positions <= i-s+1 (the true features of its anchor's
context) and to the step-t keys at position i-s+t for t = 2..s (its own chain).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["EagleConfig", "EagleHead", "KVCache", "rotary"]


@dataclass(frozen=True)
class EagleConfig:
    """Architecture of an EAGLE / EAGLE-3 head.

    Attributes:
        kind: "eagle" or "eagle3".
        hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
            rms_norm_eps, rope_theta: copied from the target's config.
        draft_vocab_size: V_draft (reduced vocabulary), tokens.
        target_vocab_size: V_target, tokens.
        feature_layers: indices into the target's ``hidden_states`` the head reads
            ((-1,) for EAGLE; low/mid/high for EAGLE-3).
        arch: the EAGLE-3 layer: "specloop" (the fused 2H -> H input above, default)
            or "published" (EAGLE-3's own layer, q/k/v over [input_layernorm(emb);
            hidden_norm(g)] with residual g:
            `specloop.realmodels.heads.eagle3_arch`). "published" needs kind
            "eagle3". `to_dict` leaves the default out, so configs saved before the
            option (and their resume signatures) read the same.
    """

    kind: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    draft_vocab_size: int
    target_vocab_size: int
    feature_layers: tuple[int, ...] = field(default=(-1,))
    arch: str = "specloop"

    def __post_init__(self) -> None:
        if self.kind not in ("eagle", "eagle3"):
            raise ValueError(f"EagleConfig.kind must be 'eagle' or 'eagle3', got {self.kind!r}")
        if self.arch not in ("specloop", "published"):
            raise ValueError(f"EagleConfig.arch must be 'specloop' or 'published', got {self.arch!r}")
        if self.arch == "published" and self.kind != "eagle3":
            raise ValueError("EagleConfig.arch 'published' is an EAGLE-3 layer: it needs kind 'eagle3'")
        if self.kind == "eagle" and tuple(self.feature_layers) != (-1,):
            raise ValueError("an EAGLE head reads the last layer only: feature_layers=(-1,)")
        if self.kind == "eagle3" and len(self.feature_layers) != 3:
            raise ValueError(f"an EAGLE-3 head fuses 3 layers, got {self.feature_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if not 1 <= self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(f"draft_vocab_size must be in [1, {self.target_vocab_size}]")
        object.__setattr__(self, "feature_layers", tuple(int(x) for x in self.feature_layers))

    @classmethod
    def from_target(cls, config, kind: str, draft_vocab_size: int,
                    feature_layers: tuple[int, ...] | None = None, arch: str = "specloop") -> "EagleConfig":
        """Copy the shapes of a transformers Llama-style ``config`` (``arch`` as the
        attribute)."""
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        if feature_layers is None:
            n = int(config.num_hidden_layers)
            feature_layers = (-1,) if kind == "eagle" else (2, n // 2, n - 3)
        return cls(kind, int(config.hidden_size), heads, int(getattr(config, "num_key_value_heads", heads)),
                   head_dim, int(config.intermediate_size), float(config.rms_norm_eps), theta,
                   int(draft_vocab_size), int(config.vocab_size), tuple(feature_layers), arch)

    def to_dict(self) -> dict:
        """The fields as a JSON-able dict; ``arch`` only when not "specloop"."""
        out = asdict(self)
        if out["arch"] == "specloop":
            del out["arch"]
        return out


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (Llama convention, halves rotated) of
    x [..., T, head_dim] at int positions [T]."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    half = dim // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


@dataclass
class KVCache:
    """Keys/values of the head's positions computed from *true* target features:
    k, v [num_kv_heads, n, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.k.shape[1])


class EagleHead(nn.Module):
    """The head. ``embed_weight`` [V_target, H] (the target's input embeddings) and
    ``lm_rows`` [V_draft, H] (the target's LM-head rows of the reduced vocabulary)
    are taken from the target; the embeddings are never trained.

    Trainable tensors (`trainable`) are what the online learners update.
    """

    def __init__(self, config: EagleConfig, embed_weight: torch.Tensor, lm_rows: torch.Tensor) -> None:
        super().__init__()
        c = config
        self.config = c
        hsz, nh, nkv, hd = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        if tuple(embed_weight.shape) != (c.target_vocab_size, hsz):
            raise ValueError(f"embed_weight must be [{c.target_vocab_size}, {hsz}], got {tuple(embed_weight.shape)}")
        if tuple(lm_rows.shape) != (c.draft_vocab_size, hsz):
            raise ValueError(f"lm_rows must be [{c.draft_vocab_size}, {hsz}], got {tuple(lm_rows.shape)}")
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.fc_feat = nn.Linear(3 * hsz, hsz, bias=False) if c.kind == "eagle3" else None
        self.norm_emb = RMSNorm(hsz, c.rms_norm_eps)
        self.norm_feat = RMSNorm(hsz, c.rms_norm_eps)
        self.fuse = nn.Linear(2 * hsz, hsz, bias=True)
        self.input_norm = RMSNorm(hsz, c.rms_norm_eps)
        self.q_proj = nn.Linear(hsz, nh * hd, bias=False)
        self.k_proj = nn.Linear(hsz, nkv * hd, bias=False)
        self.v_proj = nn.Linear(hsz, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, hsz, bias=False)
        self.post_norm = RMSNorm(hsz, c.rms_norm_eps)
        self.gate_proj = nn.Linear(hsz, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hsz, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, hsz, bias=False)
        if c.kind == "eagle3":
            self.out_norm = RMSNorm(hsz, c.rms_norm_eps)
            self.lm_head = nn.Parameter(lm_rows.detach().clone().float())
        else:
            self.out_norm = None
            self.register_buffer("lm_head", lm_rows.detach().clone().float(), persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        std = 0.02
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.gate_proj, self.up_proj, self.fuse):
            nn.init.normal_(lin.weight, std=std)
        for lin in (self.o_proj, self.down_proj):
            nn.init.zeros_(lin.weight)      # the layer starts as the identity on its input
        nn.init.zeros_(self.fuse.bias)
        if self.fc_feat is not None:
            nn.init.normal_(self.fc_feat.weight, std=1.0 / math.sqrt(3 * self.config.hidden_size))

    # ----------------------------------------------------------------- pieces
    def trainable(self) -> list[torch.Tensor]:
        """Trainable tensors (the embeddings and, for EAGLE, the LM-head rows are frozen)."""
        return [p for p in self.parameters() if p.requires_grad]

    def state_for_saving(self) -> dict[str, torch.Tensor]:
        """Tensors to save (persistent parameters only; target-derived buffers excluded)."""
        return {k: v for k, v in self.state_dict().items()}

    def project_features(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., F] -> head feature space [..., H] (EAGLE-3's fc on
        [low; mid; high], identity for EAGLE)."""
        return self.fc_feat(features) if self.fc_feat is not None else features

    def embed_input(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """x = fuse([norm(emb(tokens)); norm(feats)]); tokens [..., T] target ids,
        feats [..., T, H] in head space."""
        emb = F.embedding(tokens.long(), self.embed_weight).to(feats.dtype)
        return self.fuse(torch.cat([self.norm_emb(emb), self.norm_feat(feats)], -1))

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, H] -> q [B, nh, T, hd], k, v [B, nkv, T, hd] (rotary applied)."""
        c = self.config
        b, t, _ = x.shape
        hx = self.input_norm(x)
        q = self.q_proj(hx).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(hx).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(hx).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return self.rotate(q, positions), self.rotate(k, positions), v

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The head's rotary embedding of x [..., T, head_dim] at int positions [T]
        (`rotary` with the config's theta; a subclass may scale the frequencies)."""
        return rotary(x, positions, self.config.rope_theta)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + o_proj of the attention output attn [B, nh, T, hd], then the MLP."""
        b, _, t, _ = attn.shape
        h = x + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        m = self.post_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_draft] (reduced vocabulary) of head outputs h [..., H]."""
        if self.out_norm is not None:
            h = self.out_norm(h)
        return h @ self.lm_head.to(h.dtype).t()

    def _groups(self) -> int:
        return self.config.num_heads // self.config.num_kv_heads

    # ------------------------------------------------------------- training
    def forward_ttt(self, features: torch.Tensor, next_tokens: torch.Tensor, steps: int,
                    with_logits: bool = True) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Training-time test over a batch of teacher-forced sequences.

        Causal: position i reads positions <= i only, so sequences of different
        lengths can share a batch right-padded (the padding changes no real row).

        Args:
            features: float [B, T, F]: target features at positions 0..T-1 (F = H for
                EAGLE, 3H for EAGLE-3).
            next_tokens: int [B, T]: the token at position i+1 for each position i.
            steps: number of draft steps S >= 1.
            with_logits: False skips the LM head (logits None): a caller that needs
                a few rows applies `logits` to them itself.

        Returns:
            S pairs (h_s [B, T, H], logits_s [B, T, V_draft] or None). At every
            step, position i predicts token i+2 (the token after its input token
            x_{i+1}); at step s it does so from the anchor i-s+1 (the last true
            feature; s-1 own predicted features after it), i.e. output (s, i) is
            the s-th draft step from anchor i-s+1. Rows with i < s-1 have no
            anchor and must be masked out of losses.
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        b, t, _ = features.shape
        pos = torch.arange(t, device=features.device)
        scale = 1.0 / math.sqrt(self.config.head_dim)
        g = self._groups()
        feats = self.project_features(features)
        outs: list[tuple[torch.Tensor, torch.Tensor]] = []
        k_chain: list[torch.Tensor] = []
        v_chain: list[torch.Tensor] = []
        k1 = v1 = None
        for s in range(1, steps + 1):
            if s > 1:  # own previous output, shifted right by one position
                prev = outs[-1][0]
                feats = torch.cat([prev.new_zeros(b, 1, prev.shape[-1]), prev[:, :-1]], 1)
            x = self.embed_input(next_tokens, feats)
            q, k, v = self.qkv(x, pos)
            if s == 1:
                k1, v1 = k, v
            else:
                k_chain.append(k)
                v_chain.append(v)
            kk1, vv1 = k1.repeat_interleave(g, 1), v1.repeat_interleave(g, 1)
            scores = (q @ kk1.transpose(-1, -2)) * scale                          # [B,nh,T,T]
            allowed = pos[None, :] <= (pos[:, None] - (s - 1))
            scores = scores.masked_fill(~allowed, float("-inf"))
            diag_s, diag_v = [], []
            for j, (kc, vc) in enumerate(zip(k_chain, v_chain)):
                shift = s - (j + 2)                                             # step t=j+2 key at i-(s-t)
                kc_r, vc_r = kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1)
                if shift:
                    kc_r = torch.cat([kc_r.new_zeros(*kc_r.shape[:2], shift, kc_r.shape[-1]), kc_r[:, :, :-shift]], 2)
                    vc_r = torch.cat([vc_r.new_zeros(*vc_r.shape[:2], shift, vc_r.shape[-1]), vc_r[:, :, :-shift]], 2)
                d = (q * kc_r).sum(-1, keepdim=True) * scale
                if shift:
                    d = d.masked_fill((pos < shift)[None, None, :, None], float("-inf"))
                diag_s.append(d)
                diag_v.append(vc_r)
            all_scores = torch.cat([scores, *diag_s], -1)
            probs = torch.softmax(all_scores.float(), -1).nan_to_num(0.0).to(q.dtype)
            attn = probs[..., :t] @ vv1
            for j, vc_r in enumerate(diag_v):
                attn = attn + probs[..., t + j: t + j + 1] * vc_r
            h = self.finish(x, attn)
            outs.append((h, self.logits(h) if with_logits else None))
        return outs

    # ------------------------------------------------------------ inference
    def empty_cache(self) -> KVCache:
        c = self.config
        dt = self.q_proj.weight.dtype
        dev = self.q_proj.weight.device
        z = torch.zeros(c.num_kv_heads, 0, c.head_dim, dtype=dt, device=dev)
        return KVCache(z, z.clone())

    def extend(self, cache: KVCache, features: torch.Tensor, next_tokens: torch.Tensor) -> tuple[KVCache, torch.Tensor]:
        """Append true-feature positions to the cache (causal among themselves).

        Args:
            cache: the head's cache over positions 0..n-1.
            features: [m, F] target features of positions n..n+m-1.
            next_tokens: int [m]: token following each of those positions.

        Returns:
            (new cache, h [m, H]).
        """
        n, m = cache.length, int(features.shape[0])
        pos = torch.arange(n, n + m, device=features.device)
        x = self.embed_input(next_tokens[None], self.project_features(features.to(self.q_proj.weight.dtype))[None])
        q, k, v = self.qkv(x, pos)
        keys = torch.cat([cache.k, k[0]], 1)
        vals = torch.cat([cache.v, v[0]], 1)
        allowed = torch.arange(n + m, device=features.device)[None, :] <= pos[:, None]
        g = self._groups()
        attn = F.scaled_dot_product_attention(q, keys.repeat_interleave(g, 0)[None],
                                              vals.repeat_interleave(g, 0)[None], attn_mask=allowed)
        h = self.finish(x, attn)[0]
        return KVCache(keys, vals), h

    def step_nodes(self, cache: KVCache, parent_h: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   node_k: torch.Tensor, node_v: torch.Tensor, ancestor_mask: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One draft step for a batch of tree nodes (own features fed back).

        Args:
            cache: true-feature cache (every node attends to all of it).
            parent_h: [n, H] head output of each node's parent.
            tokens: int [n] target ids of the nodes.
            positions: int [n] sequence positions of the nodes.
            node_k, node_v: [nkv, m, hd] keys/values of earlier draft nodes.
            ancestor_mask: bool [n, m]: node attends to earlier node j iff True.

        Returns:
            (h [n, H], logits [n, V_draft], k [nkv, n, hd], v [nkv, n, hd]).
        """
        x = self.embed_input(tokens[:, None], parent_h[:, None])        # [n, 1, H]
        q, k, v = self._qkv_each(x, positions)
        n = x.shape[0]
        # one key set for all n nodes (cache, earlier nodes, this step's nodes), the nodes
        # as n queries of one batch and a tree mask: the cache is read, never copied n
        # or g times (grouped-query heads share their KV head through enable_gqa)
        new_k, new_v = k[:, :, 0].transpose(0, 1), v[:, :, 0].transpose(0, 1)         # [nkv, n, hd]
        keys = torch.cat([cache.k, node_k, new_k], 1)[None]
        vals = torch.cat([cache.v, node_v, new_v], 1)[None]
        allowed = torch.cat([torch.ones(n, cache.length, dtype=torch.bool, device=x.device), ancestor_mask,
                             torch.eye(n, dtype=torch.bool, device=x.device)], 1)
        queries = q[:, :, 0].transpose(0, 1)[None]                                     # [1, nh, n, hd]
        attn = F.scaled_dot_product_attention(queries, keys, vals, attn_mask=allowed[None, None],
                                              enable_gqa=self._groups() > 1)
        h = self.finish(x, attn[0].transpose(0, 1)[:, :, None])[:, 0]
        return h, self.logits(h), new_k, new_v

    def _qkv_each(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """qkv for [n, 1, H] inputs, each at its own position."""
        c = self.config
        n = x.shape[0]
        hx = self.input_norm(x)
        q = self.q_proj(hx).view(n, 1, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(hx).view(n, 1, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(hx).view(n, 1, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q = self.rotate(q.transpose(0, 2), positions).transpose(0, 2)
        k = self.rotate(k.transpose(0, 2), positions).transpose(0, 2)
        return q, k, v
