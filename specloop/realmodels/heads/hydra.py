"""Hydra draft heads: sequentially dependent heads, each conditioned on the previous
draft token (Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft Heads for
Medusa Decoding"; OnlineSpec's Hydra / Opt-Hydra rows).

Notation (docs/design.md, section "Notation"): the target's last-layer hidden state at position t is
``h_t`` (post final norm, so ``p_target(. | x_<=t) = softmax(lm_head(h_t))``); the
token x_{t+1} is already known when drafting (it is the round's bonus/correction
token), and head i (i = 1..K) drafts x_{t+1+i}.

Architecture (one head per draft depth)::

    z_0 = h_t
    z_i = head_i([rms(z_{i-1}) ; rms(E[x_{t+i}])])          # (d,)
    head_i(u) = r_n(... r_1(W_i u + b_i))  with r(x) = x + SiLU(A x + c)   (Medusa's ResBlock)
    q_draft_i = softmax(lm_head_reduced(z_i))               # over the reduced vocabulary

so head i sees the target's hidden state and, through the chain z_1..z_{i-1}, every
previous draft token -- Hydra's sequential dependence -- while z_i is trained to
match the target's own feature h_{t+i} (the features a head feeds forward are its
*own* predictions at training time too: the multi-step "training-time test" of
EAGLE-3, see `specloop.realmodels.training.train_hydra`).

E is the target's (frozen) input embedding, passed in at construction and never
saved with the draft. ``lm_head_reduced`` is a trainable (V_d, d) matrix initialised
from the target's LM-head rows of the reduced vocabulary (FR-Spec / EAGLE-3's
frequency-ranked subset), so a draft step costs a fraction of a target step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["HydraConfig", "HydraHeads", "ResBlock", "ReducedVocabHead", "rms_norm"]


def rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last axis (same shape/dtype)."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class ResBlock(nn.Module):
    """Medusa's residual block ``x + SiLU(W x + b)`` (Cai et al. 2024, eq. 1), with W
    initialised to zero so a fresh block is the identity."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class ReducedVocabHead(nn.Module):
    """A trainable LM head over a reduced draft vocabulary (FR-Spec; EAGLE-3).

    Buffers:
        draft_to_target: int64 (V_d,), the target id of each draft-vocabulary row.
        target_to_draft: int64 (V,), the draft row of each target id, -1 if absent.
    """

    def __init__(self, hidden_size: int, draft_to_target: torch.Tensor, target_vocab_size: int) -> None:
        super().__init__()
        ids = torch.as_tensor(draft_to_target, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise ValueError("draft_to_target must list at least one target id")
        if int(ids.min()) < 0 or int(ids.max()) >= target_vocab_size:
            raise ValueError(f"draft_to_target ids must lie in [0, {target_vocab_size}), got "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("draft_to_target has repeated target ids")
        inverse = torch.full((target_vocab_size,), -1, dtype=torch.long)
        inverse[ids] = torch.arange(ids.numel())
        self.register_buffer("draft_to_target", ids)
        self.register_buffer("target_to_draft", inverse)
        self.proj = nn.Linear(hidden_size, ids.numel(), bias=False)

    @property
    def draft_vocab_size(self) -> int:
        return int(self.draft_to_target.numel())

    @property
    def target_vocab_size(self) -> int:
        return int(self.target_to_draft.numel())

    def init_from_target(self, lm_head_weight: torch.Tensor) -> None:
        """Copy the target LM head's rows of the reduced vocabulary ((V, d) -> (V_d, d))."""
        with torch.no_grad():
            self.proj.weight.copy_(lm_head_weight[self.draft_to_target].to(self.proj.weight.dtype))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(..., d) features -> (..., V_d) draft logits."""
        return self.proj(z)

    def to_target_probs(self, q_reduced: torch.Tensor) -> torch.Tensor:
        """Scatter a reduced-vocabulary distribution (..., V_d) into the target
        vocabulary (..., V): zero probability outside the reduced vocabulary."""
        out = q_reduced.new_zeros(*q_reduced.shape[:-1], self.target_vocab_size)
        index = self.draft_to_target.expand(*q_reduced.shape[:-1], -1)
        return out.scatter_(-1, index, q_reduced)


@dataclass(frozen=True)
class HydraConfig:
    """Hydra head hyper-parameters.

    Attributes:
        hidden_size: d, the target's hidden width (576 for SmolLM2-135M).
        num_heads: K, draft depth the heads cover (tokens x_{t+2} .. x_{t+1+K}).
        num_layers: residual blocks per head after its input projection.
        target_vocab_size: V (49152 for SmolLM2).
        draft_vocab_size: V_d, rows of the reduced LM head.
    """

    hidden_size: int
    num_heads: int = 4
    num_layers: int = 1
    target_vocab_size: int = 49152
    draft_vocab_size: int = 8192

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "target_vocab_size", "draft_vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"HydraConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_layers < 0:
            raise ValueError(f"HydraConfig.num_layers must be >= 0, got {self.num_layers}")
        if self.draft_vocab_size > self.target_vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} > target_vocab_size "
                             f"{self.target_vocab_size}")

    def to_dict(self) -> dict:
        return asdict(self)


class _HydraHead(nn.Module):
    def __init__(self, width: int, num_layers: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(2 * width, width)
        with torch.no_grad():  # start as "carry the previous feature forward"
            self.in_proj.weight.zero_()
            self.in_proj.weight[:, :width].copy_(torch.eye(width))
            self.in_proj.bias.zero_()
        self.blocks = nn.Sequential(*[ResBlock(width) for _ in range(num_layers)])

    def forward(self, z_prev: torch.Tensor, token_embed: torch.Tensor) -> torch.Tensor:
        u = torch.cat([rms_norm(z_prev), rms_norm(token_embed)], dim=-1)
        return self.blocks(self.in_proj(u))


class HydraHeads(nn.Module):
    """K sequentially dependent Hydra heads over a reduced vocabulary.

    Args:
        config: `HydraConfig`.
        draft_to_target: int64 (V_d,), target ids of the reduced vocabulary.
        embed_weight: the target's input embedding matrix (V, d); kept by
            reference, frozen, and not part of `state_dict` / `parameters()`.

    Raises:
        ValueError: shapes that disagree with the config.
    """

    def __init__(self, config: HydraConfig, draft_to_target: torch.Tensor, embed_weight: torch.Tensor) -> None:
        super().__init__()
        if tuple(embed_weight.shape) != (config.target_vocab_size, config.hidden_size):
            raise ValueError(f"embed_weight has shape {tuple(embed_weight.shape)}, expected "
                             f"({config.target_vocab_size}, {config.hidden_size})")
        if int(torch.as_tensor(draft_to_target).numel()) != config.draft_vocab_size:
            raise ValueError(f"draft_to_target has {torch.as_tensor(draft_to_target).numel()} ids, "
                             f"config says draft_vocab_size={config.draft_vocab_size}")
        self.config = config
        self.heads = nn.ModuleList(_HydraHead(config.hidden_size, config.num_layers)
                                   for _ in range(config.num_heads))
        self.lm_head = ReducedVocabHead(config.hidden_size, draft_to_target, config.target_vocab_size)
        self._embed = embed_weight.detach()

    def set_embedding(self, embed_weight: torch.Tensor) -> None:
        """Point the heads at a (V, d) target input embedding (e.g. after a dtype change)."""
        self._embed = embed_weight.detach()

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids (...,) int64 -> (..., d) embeddings in the heads' dtype."""
        dtype = self.lm_head.proj.weight.dtype
        return self._embed[token_ids].to(dtype)

    def step(self, depth: int, z_prev: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step with head ``depth`` (0-based).

        Args:
            depth: head index i-1 in [0, K).
            z_prev: (B, d) previous feature (the target's h_t for depth 0).
            token_ids: (B,) int64 target ids of the token just before the one drafted.

        Returns:
            (z, logits): (B, d) predicted feature and (B, V_d) reduced-vocab logits.

        Raises:
            ValueError: depth outside [0, K).
        """
        if not 0 <= depth < self.config.num_heads:
            raise ValueError(f"Hydra head depth {depth} outside [0, {self.config.num_heads})")
        z = self.heads[depth](z_prev.to(self.lm_head.proj.weight.dtype), self.embed(token_ids))
        return z, self.lm_head(z)

    def unroll(self, h: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced unroll of all K heads (training and tests).

        Args:
            h: (B, d) target features h_t.
            token_ids: (B, K) int64, tokens x_{t+1} .. x_{t+K} fed to heads 1..K.

        Returns:
            (z, logits): (B, K, d) predicted features and (B, K, V_d) logits; entry
            i predicts x_{t+2+i}. Each z_i is computed from the heads' own z_{i-1}.
        """
        if token_ids.shape[-1] != self.config.num_heads:
            raise ValueError(f"token_ids needs {self.config.num_heads} columns, got {token_ids.shape[-1]}")
        z, feats, logits = h, [], []
        for i in range(self.config.num_heads):
            z, lg = self.step(i, z, token_ids[:, i])
            feats.append(z)
            logits.append(lg)
        return torch.stack(feats, 1), torch.stack(logits, 1)

    def trainable_parameters(self) -> list[torch.Tensor]:
        """The tensors online learners update (every parameter; the embedding is not one)."""
        return [p for p in self.parameters()]



def build_hydra(target: nn.Module, draft_to_target: torch.Tensor, num_heads: int = 4,
                num_layers: int = 1) -> HydraHeads:
    """Fresh Hydra heads for a transformers causal LM ``target`` (its embedding by
    reference; reduced LM head initialised from the target's LM-head rows)."""
    embed = target.get_input_embeddings().weight
    config = HydraConfig(int(embed.shape[1]), num_heads, num_layers, int(embed.shape[0]),
                         int(torch.as_tensor(draft_to_target).numel()))
    heads = HydraHeads(config, draft_to_target, embed)
    heads.lm_head.init_from_target(target.get_output_embeddings().weight)
    return heads.float()


def hydra_from_saved(target: nn.Module, tensors: dict[str, torch.Tensor], config: dict) -> HydraHeads:
    """Rebuild `HydraHeads` from `specloop.realmodels.heads.common.load_draft` output
    (``config["architecture"]`` holds `HydraConfig` fields).

    Raises:
        ValueError: the saved heads do not fit this target (width / vocabulary).
    """
    arch = HydraConfig(**config["architecture"])
    heads = HydraHeads(arch, tensors["lm_head.draft_to_target"], target.get_input_embeddings().weight)
    heads.load_state_dict(tensors)
    return heads.float().eval()
