"""Tiny target + fresh Hydra / Medusa heads for the online-adaptation tests (no downloads)."""
from __future__ import annotations

import torch

from specloop.realmodels.heads.head_drafting import HydraDrafter, MedusaDrafter
from specloop.realmodels.heads.hydra import HydraConfig, HydraHeads
from specloop.realmodels.heads.medusa import MedusaConfig, MedusaHeads
from specloop.realmodels.loading import LoadedModel
from tests.realmodels.heads_b_util import HIDDEN, VOCAB, tiny_target, token_stream

V_D = 80
NO_EOS = [VOCAB + 7]   # never emitted: generation runs to max_new_tokens


def tiny_loaded(seed: int = 0) -> LoadedModel:
    return LoadedModel(tiny_target(seed), None, "tiny", "test")


def hydra_drafter(target: LoadedModel, seed: int = 1, num_heads: int = 3) -> HydraDrafter:
    torch.manual_seed(seed)
    model = target.model
    heads = HydraHeads(HydraConfig(HIDDEN, num_heads, 1, VOCAB, V_D), torch.arange(V_D),
                       model.model.embed_tokens.weight)
    heads.lm_head.init_from_target(model.lm_head.weight)
    return HydraDrafter(heads.float())


def medusa_drafter(target: LoadedModel, seed: int = 1) -> MedusaDrafter:
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(HIDDEN, 3, 1, VOCAB, V_D), torch.arange(V_D))
    heads.lm_head.init_from_target(target.model.lm_head.weight)
    return MedusaDrafter(heads.float())


def prompts(n: int, length: int = 10) -> list[list[int]]:
    return [[int(t) for t in token_stream(length, seed)] for seed in range(n)]


def small_lm_drafter(target: LoadedModel):
    from specloop.realmodels.heads.small_lm import SmallLMDraft, SmallLMDraftDrafter
    torch.manual_seed(2)
    draft = SmallLMDraft.from_target(target.model, torch.arange(V_D), num_layers=1)
    return SmallLMDraftDrafter(draft)


def eagle_drafter(target: LoadedModel, kind: str = "eagle", seed: int = 3):
    from specloop.realmodels.heads.common import ReducedVocab
    from specloop.realmodels.heads.eagle import EagleConfig, EagleHead
    from specloop.realmodels.heads.eagle_drafter import EagleDrafter
    torch.manual_seed(seed)
    layers = (-1,) if kind == "eagle" else (0, 1, 2)
    cfg = EagleConfig(kind, HIDDEN, 4, 2, 8, 64, 1e-6, 10000.0, V_D, VOCAB, layers)
    model = target.model
    head = EagleHead(cfg, model.model.embed_tokens.weight.detach(), model.lm_head.weight[:V_D].detach().clone())
    return EagleDrafter(head.float(), ReducedVocab(torch.arange(V_D), VOCAB), name=kind)
