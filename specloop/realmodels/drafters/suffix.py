"""SuffixDecoding drafter: drafts from what the target produced before.

SuffixDecoding (Oliaro, Jia, Campos, Qiao; "SuffixDecoding: Extreme Speculative
Decoding for Emerging AI Applications", NeurIPS 2025; reference implementation
Arctic Inference ``arctic_inference/suffix_decoding``, vLLM ``method: "suffix"``)
keeps two suffix structures:

* a **global** one over the committed outputs of earlier requests of the stream
  (`specloop.strategies.suffix_tree.GlobalSuffixCache`: bounded depth, FIFO
  eviction by request, optional warm start from a corpus or a saved state);
* a **per-request** one over the prompt and the output so far (a
  `specloop.strategies.suffix_tree.SuffixTrie`, discarded at the next ``reset``).

Each round the longest suffix of the context (<= ``max_match`` tokens) that was ever
followed by something is matched in both, and the continuations below the two
matches are expanded best-first by their empirical path probability into *one*
candidate tree (a path's probability is the larger of its two sources'; Arctic
instead keeps the better of two separate drafts). How many of the best-first nodes
are verified is chosen per round by maximising the expected committed tokens per
second of verification, (1 + sum of the kept nodes' path probabilities) / c(n + 1),
from a measured verify-cost table c (the rule of
`specloop.strategies.lookup_length`, applied per node), instead of Arctic's fixed
``max_spec_factor * match_length`` budget. The acceptance probability of a node in
that rule is calibrated by the verifier's outcomes
(`specloop.strategies.suffix_tree.AcceptanceCalibration`): an empirical probability
from one occurrence (1.0) is overconfident.

Deterministic: ``q_draft`` is None, so verification is lossless for greedy and
sampling alike (`drafters.base`). ``observe`` adds the round's committed tokens to
the per-request trie in O(depth) per token; at the end of the request (a finished
round, or the next ``reset``) the request's output, behind the prompt's last
``prompt_tail`` tokens, joins the global structure.
"""
from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from specloop.realmodels.drafters.base import BaseDrafter, DraftProposal, DraftRequest
from specloop.realmodels.drafters.options import CONTEXT_OPTIONS, ContextOptions, field_names
from specloop.strategies.suffix_tree import (AcceptanceCalibration, GlobalSuffixCache, SuffixTrie,
                                             cost_optimal_size, expand_candidates, longest_match,
                                             monotone_cost)

__all__ = ["SuffixDrafter", "shipped_verify_cost", "verify_cost_for", "make_suffix_drafter",
           "SuffixOptions"]

#: Most nodes of a tree plan without a ``verify_size``.
DEFAULT_TREE_NODES = 64

#: The verify-cost table shipped with the package (written by benchmarks/verify_cost.py).
_COST_TABLE = ("sim", "data", "smollm2_135m_cpu_verify_cost.json")


def shipped_verify_cost(dtype: str = "float32") -> np.ndarray:
    """Seconds to verify 1..M tokens on SmolLM2-135M / CPU, from the package's table.

    Read as a package resource (no import of `specloop.sim`, which realmodels must
    not import).

    Args:
        dtype: "float32" or "bfloat16" (a torch dtype's name also works).

    Returns:
        float64 (M,): entry n-1 = median seconds of one forward over n new tokens.

    Raises:
        ValueError: unknown dtype or a malformed table.
    """
    name = "bfloat16" if "bfloat16" in str(dtype) else "float32" if "float32" in str(dtype) else str(dtype)
    text = resources.files("specloop").joinpath(*_COST_TABLE).read_text()
    try:
        entry = json.loads(text)["tables"][name]
        sizes, seconds = list(entry["num_tokens"]), np.asarray(entry["seconds"], dtype=np.float64)
    except KeyError as exc:
        raise ValueError(f"shipped verify-cost table has no {name!r} column ({exc})") from exc
    if sizes != list(range(1, len(sizes) + 1)):
        raise ValueError("shipped verify-cost table must list num_tokens 1..M")
    return seconds


def verify_cost_for(target, dtype: str = "float32") -> np.ndarray:
    """The verify-cost table a cost-pruning drafter prices ``target``'s verification by.

    On the CPU it is the shipped SmolLM2-135M / CPU table (`shipped_verify_cost`; the
    embedded target on this kind of machine). A target on any other device is timed on
    that device once, here, over as many widths as the shipped table has
    (`specloop.realmodels.padding.measure_verify_cost`: synchronised, fastest of
    repeats, non-decreasing), since another machine's seconds would prune the wrong
    trees there.

    Args:
        target: a `LoadedModel` (or a bare causal LM module).
        dtype: the shipped column used on the CPU ("float32" / "bfloat16").

    Returns:
        float64 (M,): entry n-1 = seconds to verify n tokens.

    Raises:
        ValueError: unknown dtype (`shipped_verify_cost`).
    """
    from specloop.realmodels.padding import measure_verify_cost, target_device
    shipped = shipped_verify_cost(dtype)
    device = target_device(target)
    if device is None or device.type == "cpu":
        return shipped
    model = getattr(target, "model", target)
    return np.asarray(measure_verify_cost(model, max_width=int(shipped.size)), dtype=np.float64)


class SuffixDrafter(BaseDrafter):
    """SuffixDecoding drafts: a chain or a tree from the global and per-request tries.

    Args:
        depth: trie depth (tokens, >= 2): the matched suffix plus its continuation.
        max_match: longest context suffix matched (tokens, 1 <= max_match < depth).
        max_requests, max_tokens: bounds of the global structure (FIFO by request).
        verify_cost: seconds to verify 1..M tokens (entry n-1 = n tokens), or None
            = the shipped SmolLM2 / CPU table for ``dtype``; made non-decreasing.
            The string "none" verifies every drafted node (the plan's cap).
        dtype: which shipped column when ``verify_cost`` is None.
        prior_count: pseudo-count in every conditional probability's denominator
            (>= 0); shrinks continuations seen once.
        min_prob: nodes with path probability <= this are not drafted (in [0, 1)).
        use_global, use_local: which sources draft (at least one).
        prompt_tail: how many of the prompt's last tokens are stored in front of a
            request's output in the global structure (>= 0), so that a later request
            ending like this prompt is drafted from this output's first tokens on
            (Arctic stores the output alone and cannot draft the first round).
        corpus: optional token sequences (each an iterable of ints) stored in the
            global structure as earlier requests (warm start).
        state: optional `state_dict` or path of a `save` file to start from.

    Plans: a chain plan drafts the most probable path, at most
    ``plan.num_draft_tokens`` long; a tree plan drafts best-first, at most
    ``plan.tree.verify_size`` nodes (else `DEFAULT_TREE_NODES`; never more than
    ``request.max_tokens``) to depth
    ``plan.tree.max_depth``; then the cost rule keeps the best n of them.

    Raises:
        ValueError: bad sizes or probabilities.
    """

    #: the stream runner saves this drafter's ``state_dict`` with the stream's state
    keeps_stream_state = True

    name = "suffix"

    def __init__(self, depth: int = 32, max_match: int = 16, max_requests: int = 1000,
                 max_tokens: int | None = None, verify_cost: Sequence[float] | str | None = None,
                 dtype: str = "float32", prior_count: float = 1.0, min_prob: float = 0.01,
                 use_global: bool = True, use_local: bool = True, prompt_tail: int = 8,
                 corpus: Iterable[Iterable[int]] | None = None, state: dict | str | Path | None = None):
        self.cache = GlobalSuffixCache(depth, max_requests, max_tokens)
        if self.cache.depth < 2 or isinstance(max_match, bool) or not isinstance(max_match, int) \
                or not 1 <= max_match < self.cache.depth:
            raise ValueError(f"SuffixDrafter needs depth >= 2 and 1 <= max_match < depth; "
                             f"got depth={depth}, max_match={max_match!r}")
        if not (np.isfinite(prior_count) and prior_count >= 0):
            raise ValueError(f"prior_count must be a finite number >= 0, got {prior_count!r}")
        if not 0.0 <= min_prob < 1.0:
            raise ValueError(f"min_prob must lie in [0, 1), got {min_prob!r}")
        if isinstance(prompt_tail, bool) or not isinstance(prompt_tail, int) or prompt_tail < 0:
            raise ValueError(f"prompt_tail must be an integer >= 0, got {prompt_tail!r}")
        self.prompt_tail = prompt_tail
        if not (use_global or use_local):
            raise ValueError("SuffixDrafter needs at least one of use_global, use_local")
        if isinstance(verify_cost, str):
            if verify_cost != "none":
                raise ValueError(f"verify_cost must be a table, None or 'none', got {verify_cost!r}")
            self.verify_cost = None
        else:
            self.verify_cost = monotone_cost(shipped_verify_cost(dtype) if verify_cost is None else verify_cost)
        self.max_match, self.prior_count, self.min_prob = max_match, float(prior_count), float(min_prob)
        self.use_global, self.use_local = bool(use_global), bool(use_local)
        self.calibration = AcceptanceCalibration(self.prior_count)
        self._pending: tuple[list[int], list] | None = None      # (parents, stats) of the last proposal
        if state is not None:
            self.load(state) if isinstance(state, (str, Path)) else self.load_state_dict(state)
        for seq in corpus or ():
            self.cache.add(seq)
        self._local: SuffixTrie | None = None
        self._active: list = []
        self._seq: list[int] = []
        self._lead: list[int] = []                    # the prompt's tail stored before the output
        self._output: list[int] = []
        self._open = False                            # a request whose output is not yet global

    # -- request life cycle ----------------------------------------------------------
    def reset(self, prompt_ids: torch.Tensor, *, target_hidden=None) -> None:
        """Start a request: the previous one's output joins the global structure, the
        per-request trie is rebuilt over ``prompt_ids`` (int64 (L,)). O(L * depth)."""
        self.end_request()
        self._start([int(t) for t in torch.as_tensor(prompt_ids).reshape(-1).tolist()])

    def _start(self, prompt: list[int]) -> None:
        self._local = SuffixTrie(self.cache.depth)
        self._active = self._local.extend(self._local.start(), prompt)
        self._seq, self._output, self._open = list(prompt), [], True
        self._lead = list(prompt[max(0, len(prompt) - self.prompt_tail):])

    def end_request(self) -> None:
        """Move the current request's output into the global structure (idempotent)."""
        if self._open and self._output:
            self.cache.add(self._lead + self._output)
        self._open = False

    def _append(self, tokens: Sequence[int]) -> None:
        for tok in tokens:
            self._active = self._local.append(self._active, tok)
        self._seq.extend(tokens)
        self._output.extend(tokens)

    def observe(self, feedback) -> None:
        """Add the round's committed tokens (O(depth) each), update the acceptance
        calibration from the verified nodes; a finished round ends the request."""
        if self._local is None:
            return None
        self._calibrate(feedback)
        self._append([int(t) for t in feedback.committed_tokens.reshape(-1).tolist()])
        if feedback.finished:
            self.end_request()
        return None

    def _calibrate(self, feedback) -> None:
        """Every verified node whose parent was accepted was tested: accepted or not
        (after a round stopped by EOS / max_new_tokens only the accepted ones count)."""
        pending, self._pending = self._pending, None
        proposal = feedback.proposal
        if pending is None or proposal.size == 0:
            return
        parents, stats = pending
        ours = [proposal.draft_node(i) for i in range(proposal.size)]
        if any(not 0 <= node < len(stats) for node in ours):
            return                                    # not our proposal: nothing to learn
        accepted = {ours[i] for i in feedback.accepted_nodes}
        for node in ours:
            tested = parents[node] < 0 or parents[node] in accepted
            if tested and (node in accepted or not feedback.finished):
                self.calibration.update(*stats[node], accepted=node in accepted)

    def _sync(self, ids: list[int]) -> None:
        """Follow a context that was not reported through ``observe`` (a drafter driven
        by hand): extend when it continues ours, else restart on it as a prompt."""
        if self._local is None or len(ids) < len(self._seq) or \
                (self._seq and ids[len(self._seq) - 1] != self._seq[-1]):
            self.end_request()
            self._start(ids)
        elif len(ids) > len(self._seq):
            self._append(ids[len(self._seq):])

    # -- drafting --------------------------------------------------------------------
    def candidates(self, context: Sequence[int], depth_cap: int, max_nodes: int,
                   chain: bool = False, stats: list | None = None) -> tuple[list[int], list[int], list[float]]:
        """Best-first candidates (tokens, parents, empirical path probabilities) for
        ``context`` before the cost rule; see `expand_candidates`."""
        sources, lengths = [], []
        tail = list(context[-self.max_match:])
        for trie, on in ((self._local, self.use_local), (self.cache.trie, self.use_global)):
            if on and trie is not None:
                node, matched = longest_match(trie, tail, self.max_match)
                sources.append((node, trie.depth - matched))
                lengths.append(matched)
        return expand_candidates(sources, depth_cap, max_nodes, self.prior_count, self.min_prob, chain,
                                 stats, lengths)

    def acceptance_estimates(self, parents: Sequence[int], stats: Sequence) -> list[float]:
        """Calibrated (optimistic) acceptance probability of each candidate: the
        product of `AcceptanceCalibration.estimate` along its path (parents first)."""
        out: list[float] = []
        for parent, (count, total, length) in zip(parents, stats):
            cond = self.calibration.estimate(count, total, length)
            out.append(cond if parent < 0 else out[parent] * cond)
        return out

    def propose(self, request: DraftRequest) -> DraftProposal:
        """Draft for ``request`` (see the class docstring for the plan's caps).

        Returns:
            A `DraftProposal` (q_draft None) of the cost-optimal best-first nodes,
            ``node_probs`` = their empirical path probabilities (float64); empty when
            nothing matched or verifying nothing is cheapest per expected token.
        """
        plan = request.plan
        length = int(request.ids.shape[0])
        if length != len(self._seq) or not length or int(request.ids[-1]) != self._seq[-1]:
            self._sync(request.ids.reshape(-1).tolist())     # not followed through observe
        context = self._seq[-self.max_match:]
        if plan.tree is None:
            depth_cap = max_nodes = min(plan.num_draft_tokens, request.max_tokens)
        else:
            depth_cap = min(int(plan.tree.max_depth), plan.num_draft_tokens)
            max_nodes = min(request.max_tokens, plan.tree.verify_size or DEFAULT_TREE_NODES)
        stats: list = []
        tokens, parents, probs = self.candidates(context, depth_cap, max_nodes, chain=plan.tree is None,
                                                 stats=stats)
        accept = self.acceptance_estimates(parents, stats)
        keep = len(tokens) if self.verify_cost is None else cost_optimal_size(accept, self.verify_cost)
        self._pending = (parents[:keep], stats[:keep]) if keep else None
        if keep == 0:
            return DraftProposal.empty(device=request.ids.device)
        device = request.ids.device
        return DraftProposal(torch.tensor(tokens[:keep], dtype=torch.long, device=device),
                             torch.tensor(parents[:keep], dtype=torch.long, device=device),
                             None, torch.tensor(probs[:keep], dtype=torch.float64))

    # -- state -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-able state of the global structure (`GlobalSuffixCache.state_dict`),
        the open request's output included as if it had finished."""
        state = self.cache.state_dict()
        if self._open and self._output:
            probe = GlobalSuffixCache(self.cache.depth, self.cache.max_requests, self.cache.max_tokens)
            probe.load_state_dict(state)
            probe.add(self._lead + self._output)
            state = probe.state_dict()
        return {"kind": "suffix", "global": state, "calibration": self.calibration.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the global structure by a saved one.

        Raises:
            ValueError: not a suffix-drafter state, or a trie depth other than ours.
        """
        if not isinstance(state, dict) or state.get("kind") != "suffix" or "global" not in state:
            raise ValueError("not a SuffixDrafter state (expected {'kind': 'suffix', 'global': ...})")
        if int(state["global"].get("depth", -1)) != self.cache.depth:
            raise ValueError(f"saved suffix state has depth {state['global'].get('depth')}, "
                             f"this drafter {self.cache.depth}")
        self.cache.load_state_dict(state["global"])
        if "calibration" in state:
            self.calibration.load_state_dict(state["calibration"])

    def save(self, path: str | Path) -> None:
        """Write `state_dict` as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.state_dict()))

    def load(self, path: str | Path) -> None:
        """Read a `save` file. Raises FileNotFoundError, ValueError (malformed)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"suffix drafter state not found: {path}")
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a suffix drafter state ({exc})") from exc
        self.load_state_dict(state)


@dataclasses.dataclass(frozen=True)
class SuffixOptions(ContextOptions):
    """Options of ``--draft suffix`` (`make_suffix_drafter`): the `ContextOptions`
    (``dtype`` default "float32": the shipped verify-cost column) and those of
    `SuffixDrafter`, with its defaults.

    Attributes:
        depth (int, 32), max_match (int, 16), max_requests (int, 1000), max_tokens
        (int | None, None), verify_cost (sequence of float | "none" | None, None =
        `verify_cost_for` the target), prior_count (float, 1.0), min_prob (float,
        0.01), use_global (bool, True), use_local (bool, True), prompt_tail (int, 8),
        corpus (iterable of token sequences | None), state (dict | str | Path | None):
        as `SuffixDrafter`'s arguments.
    """
    kind = "suffix"

    dtype: str | torch.dtype | None = "float32"
    depth: int = 32
    max_match: int = 16
    max_requests: int = 1000
    max_tokens: int | None = None
    verify_cost: Sequence[float] | str | None = None
    prior_count: float = 1.0
    min_prob: float = 0.01
    use_global: bool = True
    use_local: bool = True
    prompt_tail: int = 8
    corpus: Iterable[Iterable[int]] | None = None
    state: dict | str | Path | None = None


def make_suffix_drafter(target, **options) -> SuffixDrafter:
    """Registry factory (``--draft suffix``).

    Args:
        target: the target's `LoadedModel` (or None: the shipped CPU table).
        **options: the fields of `SuffixOptions` (any `ContextOptions` is accepted;
            only ``dtype`` is used: the shipped column on the CPU); without
            ``verify_cost`` the table is `verify_cost_for` the target (a device
            target is timed once).

    Raises:
        ValueError: an option `SuffixOptions` does not declare, a wrong type, or a
            bad value (`SuffixDrafter`).
    """
    opts = SuffixOptions.from_options(options)
    own = {name: getattr(opts, name) for name in field_names(SuffixOptions) if name not in CONTEXT_OPTIONS}
    dtype = str(opts.dtype)
    if own["verify_cost"] is None:
        own["verify_cost"] = verify_cost_for(target, dtype)
    return SuffixDrafter(dtype=dtype, **own)
