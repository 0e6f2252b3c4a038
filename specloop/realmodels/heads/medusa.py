"""Medusa draft heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads", Section 2.1.1; OnlineSpec's baselines).

Notation (docs/design.md, section "Notation"): ``h_t`` is the target's last-layer hidden state at position t
(post final norm). The target's own LM head on ``h_t`` gives x_{t+1} (the round's
bonus/correction token); Medusa head i (i = 1..K) predicts x_{t+1+i} from ``h_t``
alone, independently of the other heads (Medusa eq. 1)::

    p_i = softmax(lm_head_reduced(h_t + SiLU(W_i h_t + b_i)))     # n residual blocks

Deviation from the paper, documented: all heads share one trainable LM head over
the reduced (frequency-ranked) vocabulary, initialised from the target's LM-head
rows, so that a draft step costs a fraction of a target step and the fp16 draft
fits in 25 MB (K separate 49k-row heads would be K x 56 MB).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from specloop.realmodels.heads.hydra import ReducedVocabHead, ResBlock

__all__ = ["MedusaConfig", "MedusaHeads"]


@dataclass(frozen=True)
class MedusaConfig:
    """Medusa head hyper-parameters.

    Attributes:
        hidden_size: d, the target's hidden width.
        num_heads: K, number of heads (draft depth, tokens x_{t+2} .. x_{t+1+K}).
        num_layers: residual blocks per head (Medusa uses 1).
        target_vocab_size: V.
        draft_vocab_size: V_d, rows of the shared reduced LM head.
    """

    hidden_size: int
    num_heads: int = 4
    num_layers: int = 1
    target_vocab_size: int = 49152
    draft_vocab_size: int = 8192

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "num_layers", "target_vocab_size", "draft_vocab_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"MedusaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.draft_vocab_size > self.target_vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} > target_vocab_size "
                             f"{self.target_vocab_size}")

    def to_dict(self) -> dict:
        return asdict(self)


class MedusaHeads(nn.Module):
    """K Medusa heads with a shared reduced-vocabulary LM head.

    Args:
        config: `MedusaConfig`.
        draft_to_target: int64 (V_d,), target ids of the reduced vocabulary.

    Raises:
        ValueError: ``draft_to_target`` disagrees with the config.
    """

    def __init__(self, config: MedusaConfig, draft_to_target: torch.Tensor) -> None:
        super().__init__()
        if int(torch.as_tensor(draft_to_target).numel()) != config.draft_vocab_size:
            raise ValueError(f"draft_to_target has {torch.as_tensor(draft_to_target).numel()} ids, "
                             f"config says draft_vocab_size={config.draft_vocab_size}")
        self.config = config
        self.heads = nn.ModuleList(nn.Sequential(*[ResBlock(config.hidden_size) for _ in range(config.num_layers)])
                                   for _ in range(config.num_heads))
        self.lm_head = ReducedVocabHead(config.hidden_size, draft_to_target, config.target_vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """All heads at once.

        Args:
            h: (..., d) target features h_t.

        Returns:
            (..., K, V_d) reduced-vocabulary logits; index i predicts x_{t+2+i}.
        """
        h = h.to(self.lm_head.proj.weight.dtype)
        feats = torch.stack([head(h) for head in self.heads], dim=-2)
        return self.lm_head(feats)

    def trainable_parameters(self) -> list[torch.Tensor]:
        """The tensors online learners update."""
        return list(self.parameters())

    def head_logits(self, h: torch.Tensor, depth: int) -> torch.Tensor:
        """(B, d) features -> (B, V_d) logits of head ``depth`` (0-based) only.

        Raises:
            ValueError: depth outside [0, K).
        """
        if not 0 <= depth < self.config.num_heads:
            raise ValueError(f"Medusa head depth {depth} outside [0, {self.config.num_heads})")
        return self.lm_head(self.heads[depth](h.to(self.lm_head.proj.weight.dtype)))



def build_medusa(target: nn.Module, draft_to_target: torch.Tensor, num_heads: int = 4,
                 num_layers: int = 1) -> MedusaHeads:
    """Fresh Medusa heads for a transformers causal LM ``target`` (shared reduced LM
    head initialised from the target's LM-head rows; ResBlocks start as identity, so
    a fresh head i predicts the target's own next token, as in Medusa)."""
    weight = target.get_output_embeddings().weight
    config = MedusaConfig(int(weight.shape[1]), num_heads, num_layers, int(weight.shape[0]),
                          int(torch.as_tensor(draft_to_target).numel()))
    heads = MedusaHeads(config, draft_to_target)
    heads.lm_head.init_from_target(weight)
    return heads.float()


def medusa_from_saved(target: nn.Module, tensors: dict[str, torch.Tensor], config: dict) -> MedusaHeads:
    """Rebuild `MedusaHeads` from `specloop.realmodels.heads.common.load_draft` output.

    Raises:
        ValueError: the saved heads do not fit this target's vocabulary.
    """
    arch = MedusaConfig(**config["architecture"])
    if arch.target_vocab_size != int(target.get_output_embeddings().weight.shape[0]):
        raise ValueError(f"saved Medusa heads are for a vocabulary of {arch.target_vocab_size} tokens, "
                         f"the target has {int(target.get_output_embeddings().weight.shape[0])}")
    heads = MedusaHeads(arch, tensors["lm_head.draft_to_target"])
    heads.load_state_dict(tensors)
    return heads.float().eval()
