"""A small causal LM draft with the target's tokenizer, distilled from the target
(the "Vanilla SD" / OSD draft of OnlineSpec Table 1; Leviathan et al. 2023 use a
smaller model of the same family; DistilBERT-style initialisation, Sanh et al.
2019: the student takes a subset of the teacher's layers).

Architecture: a Llama decoder of ``num_layers`` layers of the target's width (the
target's attention / MLP shapes and RoPE settings), initialised from the target's
layers ``init_layers`` and final norm; the input embedding is the target's, frozen
and *not* stored with the draft; the output is a trainable reduced-vocabulary LM
head (`ReducedVocabHead`, FR-Spec) initialised from the target's LM-head rows.
q_draft over the target vocabulary is the reduced softmax scattered back (zero
outside the reduced vocabulary).

Training (`specloop.realmodels.training.train_small_lm`) is teacher-forced
distillation on the target's cached top-K distributions of real text.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from transformers import LlamaConfig, LlamaModel

from specloop.realmodels.heads.hydra import ReducedVocabHead

__all__ = ["SmallLMConfig", "SmallLMDraft", "SmallLMDraftDrafter", "default_init_layers"]


def default_init_layers(num_layers: int, target_layers: int) -> tuple[int, ...]:
    """Target layers to copy: the first ``num_layers - 1`` and the last one (the
    last layer shapes the residual stream the LM head reads)."""
    if not 1 <= num_layers <= target_layers:
        raise ValueError(f"num_layers must be in [1, {target_layers}], got {num_layers}")
    if num_layers == 1:
        return (target_layers - 1,)
    return (*range(num_layers - 1), target_layers - 1)


@dataclass(frozen=True)
class SmallLMConfig:
    """Small-LM draft hyper-parameters.

    Attributes:
        num_layers: decoder layers of the draft.
        draft_vocab_size: V_d, rows of the reduced LM head.
        init_layers: target layer indices copied into the draft's layers (len =
            num_layers); empty = `default_init_layers`.
        llama: the target's `LlamaConfig` fields the draft copies (``to_dict()``),
            filled by `SmallLMDraft.from_target`.
    """

    num_layers: int = 4
    draft_vocab_size: int = 8192
    init_layers: tuple[int, ...] = ()
    llama: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.draft_vocab_size < 1:
            raise ValueError(f"num_layers and draft_vocab_size must be >= 1: {self}")
        if self.init_layers and len(self.init_layers) != self.num_layers:
            raise ValueError(f"init_layers {self.init_layers} must list {self.num_layers} target layers")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["init_layers"] = list(self.init_layers)
        return out


def _draft_llama_config(config: SmallLMConfig) -> LlamaConfig:
    fields = dict(config.llama)
    fields.update(num_hidden_layers=config.num_layers, vocab_size=1, tie_word_embeddings=False,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    for key in ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype",
                "model_type", "quantization_config"):
        fields.pop(key, None)
    return LlamaConfig(**fields)


class SmallLMDraft(nn.Module):
    """A small Llama draft over the target's tokenizer with a reduced output vocabulary.

    Args:
        config: `SmallLMConfig` (``llama`` must hold the target's Llama fields).
        draft_to_target: int64 (V_d,) target ids of the reduced vocabulary.
        embed_weight: the target's input embedding (V, d); by reference, frozen,
            never saved.

    Raises:
        ValueError: shapes that disagree with the config.
    """

    def __init__(self, config: SmallLMConfig, draft_to_target: torch.Tensor, embed_weight: torch.Tensor) -> None:
        super().__init__()
        llama = _draft_llama_config(config)
        if embed_weight.shape[-1] != llama.hidden_size:
            raise ValueError(f"embedding width {embed_weight.shape[-1]} != hidden_size {llama.hidden_size}")
        if int(torch.as_tensor(draft_to_target).numel()) != config.draft_vocab_size:
            raise ValueError(f"draft_to_target has {torch.as_tensor(draft_to_target).numel()} ids, "
                             f"config says draft_vocab_size={config.draft_vocab_size}")
        self.config = config
        self.decoder = LlamaModel(llama)
        self.decoder.embed_tokens.weight.requires_grad_(False)   # unused 1-row table
        self.lm_head = ReducedVocabHead(llama.hidden_size, draft_to_target, int(embed_weight.shape[0]))
        self._embed = embed_weight.detach()

    @classmethod
    def from_target(cls, target: nn.Module, draft_to_target: torch.Tensor, num_layers: int = 4,
                    init_layers: tuple[int, ...] = ()) -> "SmallLMDraft":
        """Build and initialise from a transformers Llama-family causal LM ``target``
        (its layers ``init_layers``, final norm, LM-head rows, embedding)."""
        tcfg = target.config
        layers = tuple(init_layers) or default_init_layers(num_layers, tcfg.num_hidden_layers)
        config = SmallLMConfig(num_layers, int(torch.as_tensor(draft_to_target).numel()), layers,
                               {k: v for k, v in tcfg.to_dict().items() if _jsonable(v)})
        draft = cls(config, draft_to_target, target.get_input_embeddings().weight)
        inner = target.model
        with torch.no_grad():
            for mine, src in zip(draft.decoder.layers, layers):
                mine.load_state_dict(copy.deepcopy(inner.layers[src].state_dict()))
            draft.decoder.norm.load_state_dict(inner.norm.state_dict())
            draft.lm_head.init_from_target(target.get_output_embeddings().weight)
        return draft.float()

    def set_embedding(self, embed_weight: torch.Tensor) -> None:
        self._embed = embed_weight.detach()

    def forward(self, input_ids: torch.Tensor, past_key_values=None, position_ids=None,
                use_cache: bool = False, attention_mask: torch.Tensor | None = None):
        """(B, T) target ids -> (logits (B, T, V_d), cache or None); ``attention_mask``:
        None (causal) or a float additive (B, 1, T, cache_len + T) mask (tree drafting)."""
        embeds = self._embed[input_ids].to(self.lm_head.proj.weight.dtype)
        out = self.decoder(inputs_embeds=embeds, cache=past_key_values, position_ids=position_ids,
                           use_cache=use_cache, attention_mask=attention_mask)
        return self.lm_head(out.last_hidden_state), (out.cache if use_cache else None)

    def trainable_parameters(self) -> list[torch.Tensor]:
        """Tensors the online learners update (everything but the frozen embedding)."""
        return [p for p in self.parameters() if p.requires_grad]


def _jsonable(value) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), list, tuple, dict))


class SmallLMDraftDrafter:
    """`SmallLMDraft` behind the decoder's Drafter interface, with its own KV cache.

    The cache holds a prefix of the committed sequence plus the last round's draft;
    each `propose` crops it to the longest prefix shared with ``request.ids`` (so
    rejected draft tokens disappear) and feeds the rest. Chains report
    ``q_draft`` (the processed reduced distribution scattered to the target
    vocabulary); trees (static ``branching`` or EAGLE-2 ``top_k``) choose top
    children deterministically and report ``q_draft=None``, running each depth as
    one batch over the frontier's paths on a copy of the prefix cache.
    """

    name = "small-lm"
    needs_target_hidden: tuple[int, ...] = ()

    def __init__(self, draft: SmallLMDraft) -> None:
        self.draft = draft.eval()
        self.vocab = draft.lm_head
        self._cache = None
        self._cached: list[int] = []
        self._unread: list[torch.Tensor] = []   # fed draft tokens still on the device (read at the next sync)

    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        """Start a prompt (``prompt_ids`` int64 (L,)); the cache fills lazily.

        Raises:
            ValueError: empty prompt.
        """
        if prompt_ids.numel() == 0:
            raise ValueError("small-lm draft: empty prompt")
        from transformers import DynamicCache
        self._cache, self._cached, self._unread = DynamicCache(), [], []

    def observe(self, feedback) -> None:
        return None

    def parameters(self) -> list[torch.Tensor]:
        return self.draft.trainable_parameters()

    # -- online-training accessors (`specloop.realmodels.online`) ----------------
    @property
    def target_to_draft(self) -> torch.Tensor:
        """int64 (V_target,): the draft-vocabulary row of each target token id, -1 for
        ids outside the draft's reduced vocabulary."""
        return self.vocab.target_to_draft

    def context_logits(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Draft logits at every position of a context window, without the KV cache,
        differentiable w.r.t. ``parameters()`` (call under ``torch.enable_grad()``).

        Args:
            ids: int64 (T,) target token ids (the draft shares the target's tokenizer).
            start: absolute position of ``ids[0]`` (>= 0; the window's position ids).

        Returns:
            (T, V_draft) logits over the reduced vocabulary (row i predicts the token
            after ``ids[i]``), in the draft's dtype and device.

        Raises:
            ValueError: empty ids or negative start.
        """
        ids = ids.reshape(-1)
        if ids.numel() == 0 or int(start) < 0:
            raise ValueError(f"need a non-empty window and start >= 0, got {ids.numel()} tokens at {start}")
        device = self.vocab.proj.weight.device
        pos = torch.arange(int(start), int(start) + ids.numel(), device=device)[None]
        logits, _ = self.draft(ids[None].to(device).long(), None, pos, use_cache=False)
        return logits[0]

    def _feed(self, ids) -> torch.Tensor:
        """Feed ``ids`` (a list of ints, or an int64 (1,) tensor on the draft's device:
        a drafted token, read back at the next `_sync`) after the cache; returns
        (V_d,) logits of the last one."""
        start = len(self._cached) + sum(int(t.numel()) for t in self._unread)
        device = self.vocab.proj.weight.device      # on the draft's device (CUDA: no CPU ids / positions)
        if torch.is_tensor(ids):
            inp = ids.reshape(1, -1).to(device)
            self._unread.append(inp.reshape(-1))
        else:
            inp = torch.tensor([ids], dtype=torch.long, device=device)
            self._cached.extend(ids)
        pos = torch.arange(start, start + int(inp.shape[1]), device=device)[None]
        logits, self._cache = self.draft(inp, self._cache, pos, use_cache=True)
        return logits[0, -1]

    def _sync(self, ids: list[int]) -> torch.Tensor:
        if self._unread:                            # last round's fed draft tokens, in one read
            self._cached.extend(torch.cat(self._unread).tolist())
            self._unread = []
        common = 0
        for a, b in zip(self._cached, ids[:-1]):
            if a != b:
                break
            common += 1
        if common == 0 and self._cached:
            from transformers import DynamicCache
            self._cache, self._cached = DynamicCache(), []
        elif common < len(self._cached):
            self._cache.crop(-(len(self._cached) - common))   # transformers 5: negative = tokens to drop
            del self._cached[common:]
        return self._feed(ids[common:])

    @torch.no_grad()
    def propose(self, request):
        from specloop.realmodels.drafters.base import DraftProposal
        from specloop.realmodels.heads.head_drafting import draft_tree
        from specloop.realmodels.sampling import check_finite, draft_index, processed_probs
        ids = request.ids.tolist()
        if self._cache is None:
            raise ValueError("small-lm draft: propose() before reset()")
        if request.plan.num_draft_tokens == 0 or request.max_tokens <= 0:
            return DraftProposal.empty(device="cpu")
        logits = self._sync(ids)
        device = self.vocab.proj.weight.device
        if request.plan.tree is not None:
            cap = min(request.plan.tree.max_depth, request.plan.num_draft_tokens)
            return draft_tree(self._tree_expand(ids, logits), torch.zeros(1, 1, device=device), ids[-1], cap,
                              request, self.vocab)
        k = min(request.plan.num_draft_tokens, request.max_tokens)
        tokens, rows, raw = [], [], []              # tokens stay on the device (the session reads them once)
        for step in range(k):
            raw.append(logits)
            probs = processed_probs(logits, request.sampling, check=False)
            tid = draft_index(probs, request.sampling, request.generator)
            rows.append(probs)
            tokens.append(self.vocab.draft_to_target.index_select(0, tid))
            if step < k - 1:
                logits = self._feed(tokens[-1])
        check_finite(torch.stack(raw), "model")      # every step's logits, in one read
        q = self.vocab.to_target_probs(torch.stack(rows))
        return DraftProposal.chain(torch.cat(tokens), q)

    def _tree_expand(self, ids: list[int], root_logits: torch.Tensor):
        """An ``expand`` for `draft_tree`: states are (B, depth) int64 paths.

        Depth d feeds the B paths' B * d tokens as one sequence after the prefix cache,
        each token attending to the whole prefix and to its own path's earlier tokens (a
        block-diagonal causal mask), then crops the cache back to the prefix: the prefix
        cache is read in place, never copied per path or per depth."""
        prefix = len(self._cached)

        def expand(paths: torch.Tensor, tokens: torch.Tensor, depth: int):
            device = self.vocab.proj.weight.device
            if depth == 0:
                return torch.zeros(1, 0, dtype=torch.long, device=device), root_logits[None]
            paths = torch.cat([paths, tokens.reshape(-1, 1).to(paths.device)], dim=1)     # (B, depth), on the device
            width = paths.shape[0]
            mask = _path_block_mask(width, depth, prefix, self.vocab.proj.weight.dtype, device)
            pos = (prefix + torch.arange(depth, device=device)).repeat(width)[None]
            logits, _ = self.draft(paths.reshape(1, -1), self._cache, pos, use_cache=True, attention_mask=mask)
            self._cache.crop(-(width * depth))                      # drop the B * d path tokens
            return paths, logits[0].view(width, depth, -1)[:, -1]
        return expand


def _path_block_mask(paths: int, depth: int, prefix: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Float additive mask (1, 1, P * d, prefix + P * d) of ``paths`` sequences of
    ``depth`` tokens laid end to end after a ``prefix``: token (b, j) sees the prefix
    and tokens (b, j') with j' <= j."""
    n = paths * depth
    idx = torch.arange(n, device=device)
    same_path = (idx[:, None] // depth) == (idx[None, :] // depth)
    allowed = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=device),
                         same_path & (idx[None, :] <= idx[:, None])], 1)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[None, None]


def small_lm_from_saved(target: nn.Module, tensors: dict[str, torch.Tensor], config: dict) -> SmallLMDraft:
    """Rebuild a `SmallLMDraft` from `specloop.realmodels.heads.common.load_draft`
    output (``config["architecture"]`` holds `SmallLMConfig` fields).

    Raises:
        ValueError: the saved draft does not fit this target.
    """
    arch = dict(config["architecture"])
    arch["init_layers"] = tuple(arch.get("init_layers", ()))
    draft = SmallLMDraft(SmallLMConfig(**arch), tensors["lm_head.draft_to_target"],
                         target.get_input_embeddings().weight)
    draft.load_state_dict(tensors)
    return draft.float().eval()
