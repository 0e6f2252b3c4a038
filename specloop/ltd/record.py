"""Record replayable LTD rounds from the real decoder: for *every*
position of a greedy generation, the drafter's full EAGLE-2 tree and the target's
greedy token after every node a policy could ever verify, plus the measured
costs. `specloop.ltd.env_replay` replays them as an LTD environment.

Why this is exact. Under greedy decoding the target's output does not depend on
the drafts, and an EAGLE-style drafter's state at position t depends only on the
committed tokens and the target's features there, so the tree drafted at t is the
same whichever rounds led to t. Recording one tree per position therefore lets any
depth / verification-size policy be replayed: a round at t that accepts a tokens
moves to t + a + 1. For a tree of depth <= D and size V (the best V nodes by
cumulative draft probability, `strategies.subtree.select_subtree`) the accepted path follows
the target's greedy token from the root through the kept children; the recorder
verifies the union over D = 1..max_depth of those best-``max_verify`` subtrees
(closed under ancestors) in one tree forward per position, so every such path is
known. Only the times are modelled, from real decoder rounds with static trees
(`measure_round_costs`): draft seconds per depth, verify seconds per number of
verified tokens, and the per-round update time.

The loop is the decoder's round (`DecodeSession`, the same target pass, cache pruning
and drafter feedback) with zero accepted tokens: draft the full tree, verify the union
with the tree mask on top of the KV cache, commit only the target's token at the root
(`commit(root_only=True)`: the output is plain greedy decoding) and feed the drafter
the pending token's features.

Files (one directory): ``prompt-NNNN.npz`` per prompt, written as each prompt
finishes (a rerun skips prompts already written: resumable), and ``costs.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import isotonic_regression

from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.ltd.policy import LTDConfig
from specloop.strategies.subtree import select_subtree

__all__ = ["record_prompt", "record_replay", "check_resumable", "measure_round_costs", "verified_union",
           "REPLAY_FORMAT_VERSION", "VERIFY_POINTS"]

REPLAY_FORMAT_VERSION = 1


def verified_union(depths: np.ndarray, parents: np.ndarray, probs: np.ndarray, max_depth: int,
                   max_verify: int) -> np.ndarray:
    """Indices (ascending) of every node in some ``select_subtree(.., D, max_verify)``,
    D = 1..max_depth: the nodes whose target token a replayed policy can need."""
    chosen: set[int] = set()
    for depth in range(1, max_depth + 1):
        chosen.update(int(i) for i in select_subtree(depths, parents, probs, depth, max_verify))
    return np.asarray(sorted(chosen), dtype=np.int64)


def record_prompt(model, drafter, prompt_ids: torch.Tensor, config: LTDConfig, max_depth: int,
                  max_verify: int, max_new_tokens: int, eos_ids: set[int]) -> dict:
    """Greedy-generate ``prompt_ids`` one token per round, recording each position's tree.

    Args:
        model: the target causal LM (transformers). drafter: an EAGLE-2 tree drafter
            reporting ``node_probs`` (EAGLE / EAGLE-3 heads). prompt_ids: int64 (L,), L >= 1.
        config: `LTDConfig` (its ``top_k``). max_depth: tree depth drafted (tokens).
        max_verify: largest V a replayed policy may verify (nodes).
        max_new_tokens: positions recorded (fewer at EOS).
        eos_ids: stop after committing one of these.

    Returns:
        dict of numpy arrays: ``node_offsets`` int64 (T + 1,); per node (N,):
        ``tokens``, ``parents`` (index within its position's tree, -1 = root child),
        ``depths``, ``probs`` (float64 cumulative draft probability),
        ``target_next`` (the target's greedy token after the node's path; -1 where
        not verified); per position (T,): ``root_next`` (the committed greedy token),
        ``context_length`` (tokens, pending token included); and ``prompt_ids``.

    Raises:
        ValueError: the drafter reports no node_probs; NaN logits.
    """
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.loading import LoadedModel

    decoder = SpeculativeDecoder(LoadedModel(model, None, "target", "ltd-record"), drafter,
                                 eos_token_id=sorted(eos_ids), seed=0)
    ids = prompt_ids.reshape(-1).long()
    session = decoder.session(ids, int(max_new_tokens))
    plan = DraftPlan(max_depth, TreePlan(top_k=config.top_k, max_depth=max_depth))
    sampling, generator = SamplingConfig(), torch.Generator().manual_seed(0)
    chunks = {k: [] for k in ("tokens", "parents", "depths", "probs", "target_next")}
    offsets, root_next, lengths = [0], [], []
    while not session.done:
        t, seq = len(session.trace), session.seq
        session.start_round(plan)
        # the full-depth tree at every position (not capped by the tokens left): any
        # replayed policy's tree is a part of it
        request = DraftRequest(torch.tensor(seq, dtype=torch.long, device=decoder.device), plan, 1 << 20,
                               sampling, generator, t, None)
        proposal = drafter.propose(request)
        session.mark_drafted()
        if proposal.size and proposal.node_probs is None:
            raise ValueError(f"{getattr(drafter, 'name', 'drafter')} reports no node_probs; LTD replay needs them")
        depths = proposal.depths().numpy() if proposal.size else np.zeros(0, np.int64)
        parents = proposal.parents.cpu().numpy()
        probs = proposal.node_probs.double().cpu().numpy() if proposal.size else np.zeros(0)
        union = verified_union(depths, parents, probs, max_depth, max_verify) if proposal.size else \
            np.zeros(0, np.int64)
        passed = session.target_pass(proposal.subset(union))
        argmax = passed.argmax.cpu().numpy()
        target_next = np.full(proposal.size, -1, dtype=np.int64)
        target_next[union] = argmax[1:]
        lengths.append(len(seq))
        session.commit(passed, root_only=True)       # plain greedy: only the root's token
        for key, arr in (("tokens", proposal.tokens.cpu().numpy()), ("parents", parents), ("depths", depths),
                         ("probs", probs), ("target_next", target_next)):
            chunks[key].append(np.asarray(arr))
        offsets.append(offsets[-1] + proposal.size)
        root_next.append(int(argmax[0]))
    arrays = {k: np.concatenate(v) if v else np.zeros(0) for k, v in chunks.items()}
    arrays.update(node_offsets=np.asarray(offsets, np.int64), root_next=np.asarray(root_next, np.int64),
                  context_length=np.asarray(lengths, np.int64), prompt_ids=ids.numpy())
    for key in ("tokens", "parents", "depths", "target_next"):
        arrays[key] = arrays[key].astype(np.int64)
    arrays["probs"] = arrays["probs"].astype(np.float64)
    return arrays


VERIFY_POINTS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64)   # tree sizes timed (nodes)


def measure_round_costs(target, drafter, prompt_ids: torch.Tensor, config: LTDConfig, max_depth: int,
                        max_verify: int, repeats: int = 3, tokens: int = 32) -> dict:
    """Seconds a real decoder round spends drafting to each depth and verifying each
    number of tokens, timed on the decoder itself (`SpeculativeDecoder` rounds with
    static EAGLE-2 trees on ``prompt_ids``; settings interleaved over ``repeats``
    passes after one warm-up pass; medians of `RoundRecord` times).

    * Drafting: static trees of depth D = 1..max_depth (V = 8), median
      ``draft_time`` per D. It includes the drafter absorbing the target's features
      of last round's tokens, which timing repeated proposals from one state misses.
    * Verification: static trees of V nodes (`VERIFY_POINTS` up to max_verify; depth
      min(4, max_depth)), median ``verify_time`` per verified-token count, fitted
      non-decreasing (isotonic, weighted by rounds) and linearly interpolated over
      n = 1..max_verify + 1. It includes the tree mask, the
      target's forward at real context lengths, acceptance and the KV-cache pruning:
      a bare forward of a chain on a short cache under-prices large trees (measured
      here: 61 vs 74 ms for 25 tokens).

    Returns:
        {"layer_seconds": float64 (max_depth + 1,) non-decreasing, index 0 = 0;
        "verify_seconds": float64 (max_verify + 2,) non-decreasing, index n =
        seconds for n verified tokens (index 0 = 0); "round_overhead_s": median
        update seconds; "points": the measured {n: seconds}}.

    Raises:
        ValueError: max_depth < 1 or max_verify < 1.
    """
    from specloop.realmodels.decoder import SpeculativeDecoder
    from specloop.realmodels.policy import FixedDraftPolicy

    if max_depth < 1 or max_verify < 1:
        raise ValueError(f"need max_depth >= 1 and max_verify >= 1, got {max_depth}, {max_verify}")
    settings = [("draft", d, 8) for d in range(1, max_depth + 1)]
    settings += [("verify", min(4, max_depth), v) for v in VERIFY_POINTS if v <= max_verify]
    draft: dict[int, list[float]] = {}
    verify: dict[int, list[float]] = {}
    updates: list[float] = []
    for r in range(repeats + 1):
        for kind, depth, size in settings:
            policy = FixedDraftPolicy(0) if not size else \
                FixedDraftPolicy(depth, TreePlan(top_k=config.top_k, max_depth=depth, verify_size=size))
            trace = SpeculativeDecoder(target, drafter, policy=policy).generate(prompt_ids, tokens).trace
            if not r:                  # the first pass warms up
                continue
            for rec in trace:
                updates.append(rec.update_time)
                if kind == "draft" and rec.num_draft_tokens:
                    draft.setdefault(depth, []).append(rec.draft_time)
                elif kind == "verify":
                    verify.setdefault(rec.verified_tokens, []).append(rec.verify_time)
    layer = np.zeros(max_depth + 1)
    layer[1:] = [np.median(draft.get(d, [0.0])) for d in range(1, max_depth + 1)]
    points = {n: float(np.median(v)) for n, v in sorted(verify.items())}
    # non-decreasing fit weighted by the rounds behind each median (round times are noisy)
    fit = isotonic_regression(list(points.values()), weights=[len(verify[n]) for n in points]).x
    seconds = np.interp(np.arange(1, max_verify + 2), list(points), fit)
    return {"layer_seconds": np.maximum.accumulate(layer), "round_overhead_s": float(np.median(updates)),
            "verify_seconds": np.concatenate([[0.0], seconds]), "points": points}


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


def check_resumable(directory, *, max_depth: int, max_verify: int, max_new_tokens: int, top_k: int,
                    drafter: str, dtype: str) -> None:
    """Refuse to add to a finished recording made with other settings (a rerun
    skips the prompt files already there, so they must mean the same thing).
    Needs no model: `ltd record` calls it before loading one.

    Raises:
        ValueError: the recording's depth, V, tokens per prompt, tree width,
            drafter name or dtype differ from these.
    """
    costs_path = Path(directory) / "costs.json"
    if not costs_path.is_file():
        return
    saved = json.loads(costs_path.read_text())
    now = {"max_depth": max_depth, "max_verify": max_verify, "top_k": top_k, "drafter": drafter, "dtype": dtype}
    was = {"max_depth": saved.get("max_depth"), "max_verify": saved.get("max_verify"),
           "top_k": saved.get("config", {}).get("top_k"), "drafter": saved.get("drafter"), "dtype": saved.get("dtype")}
    if "costs_from" not in saved:           # copied costs carry the source recording's token count
        now["max_new_tokens"], was["max_new_tokens"] = max_new_tokens, saved.get("max_new_tokens")
    differ = {k: (was[k], now[k]) for k in now if was[k] is not None and was[k] != now[k]}
    if differ:
        raise ValueError(f"{costs_path.parent} was recorded with other settings (recorded, asked): {differ}; "
                         "record into another directory")


def record_replay(target, drafter, prompts: list, out_dir, config: LTDConfig, *, max_depth: int,
                  max_verify: int, max_new_tokens: int, progress=None, repeats: int = 3,
                  draft_tokens: int = 32, costs_from=None) -> Path:
    """Record every prompt (skipping those already on disk) and the cost tables.

    Args:
        target: a `LoadedModel`. drafter: the EAGLE-2 tree drafter. prompts: int64
            tensors. out_dir: the replay directory. config: `LTDConfig`.
        max_depth, max_verify, max_new_tokens: see `record_prompt`.
        progress: optional callable(index, total) after each prompt.
        repeats: timing repeats of the cost tables.
        draft_tokens: tokens generated per setting when timing rounds.
        costs_from: another recording directory whose ``costs.json`` (same target,
            drafter and machine) is copied instead of measuring anew.

    Raises:
        ValueError: no prompts; a ``costs_from`` recording of smaller depth / V.
        FileNotFoundError: ``costs_from`` has no costs.json.

    Returns:
        the directory. ``costs.json`` holds ``verify_seconds`` (index = verified
        tokens), ``layer_seconds`` (index = draft depth), ``round_overhead_s``,
        ``autoregressive_step_s`` and the recording settings.
    """
    from specloop.realmodels.decoder import SpeculativeDecoder, eos_ids_of

    if not prompts:
        raise ValueError("record_replay needs at least one prompt")
    model = getattr(target, "model", target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_resumable(out, max_depth=max_depth, max_verify=max_verify, max_new_tokens=max_new_tokens,
                    top_k=config.top_k, drafter=getattr(drafter, "name", "?"), dtype=_dtype_name(model))
    eos = eos_ids_of(model, getattr(target, "tokenizer", None))
    for index, prompt in enumerate(prompts):
        path = out / f"prompt-{index:04d}.npz"
        if not path.is_file():
            data = record_prompt(model, drafter, prompt, config, max_depth, max_verify, max_new_tokens, eos)
            tmp = path.with_suffix(".tmp.npz")
            np.savez_compressed(tmp, **data)
            tmp.replace(path)
        if progress is not None:
            progress(index + 1, len(prompts))
    costs = out / "costs.json"
    if not costs.is_file() and costs_from is not None:
        source = Path(costs_from) / "costs.json"
        if not source.is_file():
            raise FileNotFoundError(f"--costs-from: {source} does not exist")
        copied = json.loads(source.read_text())
        if copied.get("max_depth", 0) < max_depth or copied.get("max_verify", 0) < max_verify:
            raise ValueError(f"{source} covers depth {copied.get('max_depth')} / V {copied.get('max_verify')}, "
                             f"less than this recording's {max_depth} / {max_verify}")
        costs.write_text(json.dumps({**copied, "costs_from": str(source)}, indent=2))
    if not costs.is_file():
        from specloop.realmodels.policy import FixedDraftPolicy
        measured = measure_round_costs(target, drafter, prompts[0], config, max_depth, max_verify, repeats,
                                       draft_tokens)
        plain = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(0)).generate(prompts[0], 16)
        step = plain.trace.total_time / max(plain.trace.total_tokens, 1)
        costs.write_text(json.dumps({
            "format_version": REPLAY_FORMAT_VERSION, "verify_seconds": measured["verify_seconds"].tolist(),
            "layer_seconds": measured["layer_seconds"].tolist(), "round_overhead_s": measured["round_overhead_s"],
            "verify_points_s": {str(k): v for k, v in measured["points"].items()}, "autoregressive_step_s": step,
            "max_depth": max_depth, "max_verify": max_verify, "max_new_tokens": max_new_tokens,
            "config": config.to_dict(), "drafter": getattr(drafter, "name", "?"),
            "dtype": _dtype_name(model),
            "prompts": len(prompts)}, indent=2))
    return out
