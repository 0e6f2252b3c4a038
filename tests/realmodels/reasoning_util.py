"""Tiny Llama models with toy character tokenizers for the reasoning tests (built here,
nothing downloaded). The target and the draft have different tokenizers: the draft's
merges a few multi-character strings, so steps must be re-tokenised as text."""
from __future__ import annotations

import string

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specloop.realmodels.loading import LoadedModel

EOS = 0


class ToyTokenizer:
    """Greedy longest-match tokenizer over printable ASCII plus ``merges``; id 0 is EOS."""

    chat_template = None
    eos_token_id = EOS

    def __init__(self, merges=()):
        pieces = sorted(set(string.printable) | set(merges), key=lambda p: (len(p), p))
        self.vocab = ["<eos>"] + pieces
        self.index = {p: i for i, p in enumerate(self.vocab)}
        self.longest = max(len(p) for p in pieces)

    def __len__(self):
        return len(self.vocab)

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            for size in range(min(self.longest, len(text) - i), 0, -1):
                piece = text[i: i + size]
                if piece in self.index:
                    ids.append(self.index[piece])
                    i += size
                    break
            else:
                raise ValueError(f"character {text[i]!r} not in the toy vocabulary")
        return ids

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids if i != EOS)


def tiny_loaded(tokenizer: ToyTokenizer, seed: int, layers: int = 2, hidden: int = 32,
                newline_bias: float = 0.0) -> LoadedModel:
    """A float32 tiny Llama over ``tokenizer``'s vocabulary; ``newline_bias`` adds to
    the LM-head logit of "\\n" so that steps end on delimiters now and then."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, eos_token_id=EOS, bos_token_id=1, pad_token_id=EOS,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)            # sharper logits: fewer near-ties in greedy decoding
        model.lm_head.weight[EOS] = -model.lm_head.weight[EOS].abs()
        if newline_bias:
            model.lm_head.weight[tokenizer.index["\n"]] += newline_bias * model.model.norm.weight.sign()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model, tokenizer, f"tiny-{seed}", "test")


def tiny_gpt2(tokenizer: ToyTokenizer, seed: int) -> LoadedModel:
    """A float32 tiny GPT-2 (absolute position embeddings: a wrong position id under
    left padding changes its output, which RoPE's relative rotation would hide)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=1024,
                        eos_token_id=EOS, bos_token_id=1, tie_word_embeddings=False)
    model = GPT2LMHeadModel(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.transformer.wpe.weight.mul_(20.0)   # positions matter visibly
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedModel(model, tokenizer, f"tiny-gpt2-{seed}", "test")


def target_and_draft():
    target = tiny_loaded(ToyTokenizer(), seed=0, newline_bias=0.3)
    draft = tiny_loaded(ToyTokenizer(merges=("\n\n", "the ", "is ", " = ", "ab")), seed=1, newline_bias=0.3)
    return target, draft


def sum_items(n: int):
    """``n`` arithmetic task items "Add i and i + 2." (answer 2 i + 2) for runner tests."""
    from specloop.realmodels.reasoning.tasks import TaskItem
    return [TaskItem("arith", f"t{i}", f"Add {i} and {i + 2}.", str(2 * i + 2)) for i in range(n)]


def contains_answer(item, text: str) -> float:
    """A runner scorer: 1.0 when the expected answer occurs in the text."""
    return float(item.answer in text)
