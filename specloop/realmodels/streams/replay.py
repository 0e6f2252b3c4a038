"""Replay a recorded stream: the real drafters, learners and policies against the
target's recorded side, exactly (docs/design.md, section "Replays").

Under greedy decoding the target's output does not depend on the draft, so the
target's side of a prompt -- its greedy continuation, the features the heads read and
its top-m next-token distribution at every position -- is recorded once
(`specloop.realmodels.recording`) and every draft replayed against it. A
`ReplaySession` is a `DecodeSession` whose target pass reads the recording instead of
running the target:

* **Acceptance.** A drafted node is on the recorded path when its token and all its
  ancestors' tokens equal the recorded continuation at their positions. The target's
  greedy token after the pending token and after every on-path node is the next
  recorded token; a node off the path gets no target token (-1) -- it is never needed,
  because greedy verification only looks at the children of accepted nodes and an
  accepted node is on the path. So the accepted path, the committed tokens and the
  EOS / ``max_new_tokens`` handling are those of `SpeculativeDecoder` token for token
  (same `verify_greedy`, same truncation code).
* **Feedback.** `VerifyFeedback` gets the rows the decoder would give: one-hot
  ``p_target`` at the recorded greedy token, ``target_logits`` = log of the recorded
  top-m probabilities (every other token -1e30, so a softmax is the renormalised top-m
  distribution; the online objectives keep the top ``top_m`` <= m tokens and
  renormalise anyway, `online.samples.sparse_targets`), and ``target_hidden`` = the
  recorded float16 features (cast to the model's dtype) of the pending token and the
  accepted nodes. Differences from the decoder: the float16 rounding of the features,
  the top-m truncation before the reduced-vocabulary restriction, and the decoder's
  features coming from a tree-masked verify forward instead of the recording's
  one-token steps; `specloop stream check-replay` measures what they change.
* **Time.** The drafter's proposal, feedback and update really run and are timed; the
  target's verification forward is priced from a measured cost table
  (``benchmarks/verify_cost.py``, `theory.VerifyCostTable`: seconds against verified
  tokens, padded widths honoured) plus the measured acceptance / bookkeeping seconds.

Greedy only: a sampled target's output depends on the draft.

Sources: OnlineSpec Algorithm 1 (draft, verify, feedback, update); the replay idea of
Arctic Inference's SuffixDecoding ``simulator.py`` and of `specloop ltd record`.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specloop.realmodels.drafters.base import Drafter, DraftProposal, VerifyFeedback
from specloop.realmodels.policy import FixedDraftPolicy
from specloop.realmodels.sampling import SamplingConfig
from specloop.realmodels.session import DecodeSession, GenerationResult, TargetPass
from specloop.realmodels.verify import VerifyOutcome, verify_greedy
from specloop.strategies.base import DraftPolicy
from specloop.strategies.engine import drive_round
from specloop.theory.speedup import VerifyCostTable

__all__ = ["ReplayDecoder", "ReplaySession", "load_verify_cost", "DEFAULT_COST_TABLE_PATH",
           "recorded_layer"]

#: the SmolLM2-135M CPU table shipped with the simulator (``benchmarks/verify_cost.py``);
#: read as a file so `realmodels` does not import `sim`
DEFAULT_COST_TABLE_PATH = Path(__file__).resolve().parents[2] / "sim" / "data" / "smollm2_135m_cpu_verify_cost.json"
_NEG = -1e30


def load_verify_cost(path: str | os.PathLike | None, dtype: str) -> VerifyCostTable:
    """The verify-cost table of ``dtype`` ("float32" / "bfloat16") from a
    ``benchmarks/verify_cost.py`` JSON (``{"tables": {dtype: {"num_tokens", "seconds"}}}``);
    None = `DEFAULT_COST_TABLE_PATH` (SmolLM2-135M on a 2-core CPU).

    Raises:
        FileNotFoundError: no such file. ValueError: not a cost table, or no table
            for ``dtype``.
    """
    file = Path(path) if path is not None else DEFAULT_COST_TABLE_PATH
    if not file.is_file():
        raise FileNotFoundError(f"no verify-cost table at {file} (write one with benchmarks/verify_cost.py)")
    try:
        tables = json.loads(file.read_text())["tables"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{file} is not a verify-cost table (benchmarks/verify_cost.py format): {exc}") from exc
    if dtype not in tables:
        raise ValueError(f"{file} has no {dtype} table (it has {sorted(tables)})")
    return VerifyCostTable(tables[dtype]["num_tokens"], tables[dtype]["seconds"])


def recorded_layer(layer: int, num_hidden_layers: int) -> int:
    """A drafter's ``hidden_states`` index as the recording names it (-1 for the last
    layer, which transformers also indexes as ``num_hidden_layers``)."""
    layer = int(layer)
    return -1 if layer in (-1, int(num_hidden_layers)) else layer


class ReplaySession(DecodeSession):
    """One recorded prompt replayed as a `RoundEngine` (see the module docstring).

    Args:
        decoder: the `ReplayDecoder`.
        prompt_ids: int64 (L,) the recorded prompt.
        max_new_tokens: cap (at most the recorded continuation unless it ended at EOS).
        stream_index: the prompt's index in the recording (and the records').
        record: `Recording.prompt(stream_index)`.
        on_tokens, profile: as `DecodeSession`.
    """

    def __init__(self, decoder, prompt_ids: torch.Tensor, max_new_tokens: int, stream_index: int, record: dict,
                 on_tokens: Callable[[list[int]], None] | None = None, profile: bool = False):
        super().__init__(decoder, prompt_ids, max_new_tokens, stream_index, on_tokens, profile)
        self.record = record
        self._tokens = np.asarray(record["tokens"], dtype=np.int64)
        self._layers = tuple(recorded_layer(x, decoder.num_hidden_layers) for x in self.drafter.needs_target_hidden)

    # -- the target's side, read from the recording ----------------------------------------
    def _hidden(self, start: int, stop: int):
        """The drafter's layers at positions [start, stop), model dtype, or None."""
        if not self._layers:
            return None
        return tuple(torch.from_numpy(np.ascontiguousarray(self.record["hidden"][layer][start:stop]))
                     .to(self.decoder.dtype) for layer in self._layers)

    def _next_token(self, position: int) -> int:
        """The target's greedy token after position ``position`` for acceptance: the
        recorded next token; -1 after the recording's last token (nothing past the
        recording is accepted: the recording ends at EOS, after which committed tokens
        are dropped, or at the token cap the replay never exceeds)."""
        if position + 1 < self._tokens.size:
            return int(self._tokens[position + 1])
        return -1

    def _top1(self, position: int) -> int:
        """The target's greedy token after ``position`` for feedback (after the
        recording's last token, e.g. an accepted EOS, its recorded top-1)."""
        if position + 1 < self._tokens.size:
            return int(self._tokens[position + 1])
        return int(self.record["topm_ids"][position, 0])

    def prefill(self) -> float:
        """Reset the drafter with the recorded features of the prompt without its last
        token (no target forward). Returns the seconds."""
        t0 = self.decoder.clock()
        length = int(self.ids.numel())
        hidden = self._hidden(0, length - 1) if length > 1 else None
        self.drafter.reset(self.ids.clone(), target_hidden=hidden)
        self.prefill_time = self.decoder.clock() - t0
        self.trace.meta["prefill_time"] = self.prefill_time
        return self.prefill_time

    def target_pass(self, proposal: DraftProposal) -> TargetPass:
        """The recorded target's greedy tokens after the pending token and each node
        (-1 off the recorded path); no logits (greedy acceptance needs none)."""
        base = len(self.seq) - 1
        tokens, parents = proposal.tokens.tolist(), proposal.parents.tolist()
        argmax = [-1] * (len(tokens) + 1)
        argmax[0] = self._next_token(base)
        depth, on_path = [0] * len(tokens), [False] * len(tokens)
        for j, (token, parent) in enumerate(zip(tokens, parents)):
            depth[j] = 1 if parent < 0 else depth[parent] + 1
            position = base + depth[j]
            if (parent < 0 or on_path[parent]) and position < self._tokens.size and token == self._tokens[position]:
                on_path[j] = True
                argmax[j + 1] = self._next_token(position)
        passed = TargetPass(proposal, None, None, 0)
        passed._argmax = torch.tensor(argmax, dtype=torch.long)
        self._phases.mark("target_forward")
        return passed

    def accept(self, passed: TargetPass) -> tuple[VerifyOutcome, None]:
        proposal = passed.proposal
        return verify_greedy(passed.argmax.tolist(), proposal.tokens.tolist(), proposal.parents.tolist(),
                             self.decoder.generator), None

    def _keep_accepted(self, passed: TargetPass, accepted: list[int]) -> None:
        return None                                   # no target cache to prune

    def _verify_seconds(self, passed: TargetPass, measured: float) -> float:
        width = self.decoder.verify_width(passed.proposal.size + 1)
        return float(self.decoder.verify_cost(width)) + measured

    def _feedback(self, passed: TargetPass, outcome: VerifyOutcome, p_target, committed: list[int],
                  eos: bool) -> VerifyFeedback:
        accepted = list(outcome.accepted_nodes)
        base, rows = len(self.seq) - 1, len(accepted) + 1
        vocab = self.decoder.vocab_size
        ids = torch.from_numpy(np.asarray(self.record["topm_ids"][base:base + rows], dtype=np.int64))
        probs = torch.from_numpy(np.asarray(self.record["topm_probs"][base:base + rows], dtype=np.float32))
        logits = torch.full((rows, vocab), _NEG, dtype=torch.float32)
        logits.scatter_(1, ids, torch.where(probs > 0, probs.clamp_min(1e-38).log(), torch.full_like(probs, _NEG)))
        greedy = torch.tensor([self._top1(base + i) for i in range(rows)], dtype=torch.long).reshape(-1, 1)
        one_hot = torch.zeros(rows, vocab, dtype=torch.float32).scatter_(1, greedy, 1.0)
        return VerifyFeedback(
            proposal=passed.proposal, accepted_nodes=tuple(accepted),
            committed_tokens=torch.tensor(committed, dtype=torch.long), p_target=one_hot, target_logits=logits,
            target_hidden=self._hidden(base, base + rows),
            child_acceptance_ratios=outcome.child_acceptance_ratios,
            finished=eos or len(committed) >= self.remaining)


class ReplayDecoder:
    """`SpeculativeDecoder`'s interface over a stream recording (greedy only).

    Args:
        recording: `recording.Recording` (`open_recording`).
        target: the recorded target (`LoadedModel` or a transformers causal LM): its
            weights serve the drafters (embeddings, LM head) and its config is checked
            against the recording; its forward never runs.
        drafter: any `Drafter` (frozen, online, hooks-asking).
        policy: `DraftPolicy` (default ``FixedDraftPolicy(5)``, as the decoder).
        seed: seeds the generator `verify_greedy` draws its one uniform from.
        verify_cost: `VerifyCostTable` of the target's verify seconds against verified
            tokens (default: `load_verify_cost(None, recording dtype)`).
        verify_widths: {block size: width} padding map, priced at the width (as the
            decoder would verify it), or None.
        recorded_index: maps the ``stream_index`` a caller passes to the recording's
            prompt index (a sub-stream, `recording.recorded_items` with
            ``every``); None = the same index.

    Raises:
        ValueError: a sampled `SamplingConfig`, a target whose vocabulary, hidden
            size or layer count differs from the recording's, a drafter reading a layer
            the recording lacks, an invalid policy or drafter.
    """

    def __init__(self, recording, target, drafter: Drafter, *, policy: DraftPolicy | None = None, seed: int = 0,
                 verify_cost: VerifyCostTable | None = None, verify_widths: dict | None = None,
                 sampling: SamplingConfig | None = None, recorded_index: Callable[[int], int] | None = None):
        if sampling is not None and not sampling.greedy:
            raise ValueError("a replay is exact only for greedy decoding (a sampled target's output "
                             "depends on the draft); use SpeculativeDecoder for sampling")
        if not isinstance(drafter, Drafter):
            raise ValueError(f"drafter {drafter!r} does not implement the Drafter interface")
        self.model = getattr(target, "model", target)
        self.tokenizer = getattr(target, "tokenizer", None)
        self.recording, self.drafter = recording, drafter
        self.policy = policy if policy is not None else FixedDraftPolicy(5)
        if not isinstance(self.policy, DraftPolicy):
            raise ValueError(f"policy {policy!r} lacks plan()/observe()")
        self.sampling = SamplingConfig()
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        info = recording.manifest["model"]
        self.eos_ids = {int(e) for e in info["eos_ids"]}
        self.vocab_size = int(info["vocab_size"])
        self.num_hidden_layers = int(info["num_hidden_layers"])
        self._check_target(info)
        self._check_layers()
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        from specloop.realmodels.decoder import context_window_of
        self.context_window = context_window_of(self.model)
        self.clock = time.perf_counter
        self.verify_cost = verify_cost if verify_cost is not None else \
            load_verify_cost(None, recording.settings["dtype"])
        self.verify_widths = verify_widths
        self.recorded_index = recorded_index

    def _check_target(self, info: dict) -> None:
        config = self.model.config
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        mine = {"vocab_size": vocab, "hidden_size": int(config.hidden_size),
                "num_hidden_layers": int(config.num_hidden_layers)}
        theirs = {k: int(info[k]) for k in mine}
        if mine != theirs:
            raise ValueError(f"the target {mine} is not the recorded one {theirs}")

    def _check_layers(self) -> None:
        wanted = {recorded_layer(x, self.num_hidden_layers) for x in self.drafter.needs_target_hidden}
        missing = sorted(wanted - set(self.recording.layers))
        if missing:
            raise ValueError(f"the drafter reads hidden_states {missing}, the recording has only "
                             f"{list(self.recording.layers)}")

    def verify_width(self, block: int) -> int:
        """Tokens a block of ``block`` tokens is priced as (the padding map's width)."""
        return block if self.verify_widths is None else self.verify_widths.get(block, block)

    def calibrate(self) -> dict[int, int]:
        return dict(self.verify_widths or {})

    def session(self, prompt_ids, max_new_tokens: int = 64, *, stream_index: int = 0,
                on_tokens: Callable[[list[int]], None] | None = None, profile: bool = False) -> ReplaySession:
        """A prefilled `ReplaySession` of recorded prompt ``stream_index``.

        Raises:
            IndexError: the prompt is not recorded. ValueError: ``prompt_ids`` are not
                the recorded prompt's, or ``max_new_tokens`` exceeds a continuation the
                recording cut at its length limit.
        """
        from specloop.realmodels.decoder import check_max_new_tokens, validate_prompt
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        ids = validate_prompt(prompt_ids, self.vocab_size, self.context_window)
        record = self.recording.prompt(stream_index if self.recorded_index is None
                                       else self.recorded_index(stream_index))
        length = record["prompt_length"]
        if ids.numel() != length or not np.array_equal(ids.numpy(), np.asarray(record["tokens"][:length])):
            raise ValueError(f"prompt {stream_index} is not the recorded one ({ids.numel()} vs {length} tokens "
                             "or other ids): replay the recording's own prompts")
        if record["stop_reason"] != "eos" and max_new_tokens > record["new_tokens"]:
            raise ValueError(f"max_new_tokens={max_new_tokens} exceeds the {record['new_tokens']} tokens recorded "
                             f"for prompt {stream_index} (recorded with max_new_tokens="
                             f"{self.recording.settings['max_new_tokens']})")
        session = ReplaySession(self, ids, max_new_tokens, stream_index, record, on_tokens, profile)
        session.prefill()
        return session

    def generate(self, prompt_ids, max_new_tokens: int = 64, *, stream_index: int = 0,
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        """Replay ``max_new_tokens`` of recorded prompt ``stream_index`` (as
        `SpeculativeDecoder.generate`; raises as `session`)."""
        session = self.session(prompt_ids, max_new_tokens, stream_index=stream_index, on_tokens=on_tokens)
        while not session.done:
            drive_round(self.policy, session)
        return session.result()
