"""benchmarks/arctic_peer.py's replay accounting (no Arctic build needed): an oracle
peer that proposes the true continuation commits budget + 1 tokens a round, an empty
one 1; specloop's suffix peer drafts a repeated request from the global trie; the built
Arctic cache, when present, agrees with the oracle bound."""
from __future__ import annotations

import pytest

from benchmarks.arctic_peer import SpecloopPeer, _accepted_nodes, replay


class _Oracle:
    def __init__(self, responses, budget):
        self.responses, self.budget, self.i = responses, budget, -1

    def start(self, prompt):
        self.i, self.pos = self.i + 1, 0

    def propose(self, max_tokens):
        toks = self.responses[self.i][self.pos:self.pos + min(self.budget, max_tokens)]
        return list(toks), list(range(-1, len(toks) - 1))

    def commit(self, tokens, finished, accepted_nodes=()):
        self.pos += len(tokens)


class _Empty(_Oracle):
    def propose(self, max_tokens):
        return [], []


STREAM = [([1, 2, 3], list(range(10, 40))), ([4, 5], list(range(50, 61)))]


def test_replay_counts_rounds_and_tokens():
    oracle = replay(_Oracle([r for _, r in STREAM], 4), STREAM)
    # 30 tokens: 6 rounds of 5 (the last proposes 4 of the 5 left... capped by the end)
    assert oracle["tokens"] == 41 and oracle["rounds"] == 6 + 3
    assert oracle["accepted_per_verified_node"] == pytest.approx(1.0)
    empty = replay(_Empty([r for _, r in STREAM], 4), STREAM)
    assert empty["rounds"] == 41 and empty["mean_accepted_length"] == 1.0 and empty["verified_nodes_per_round"] == 0


def test_accepted_nodes_follow_the_tree():
    # root children 7 (node 0) and 8 (node 1); 8 -> 9 (node 2)
    assert _accepted_nodes([7, 8, 9], [-1, -1, 1], [8, 9, 3]) == (1, 2)
    assert _accepted_nodes([7, 8, 9], [-1, -1, 1], [5]) == ()


@pytest.mark.parametrize("tree", [False, True])
def test_specloop_peer_drafts_a_repeated_request_from_earlier_outputs(tree):
    stream = [([1, 2, 3], list(range(100, 160)))] * 2
    result = replay(SpecloopPeer(8, tree, verify_cost="none"), stream)
    first, second = result["tau_by_request"]
    assert second > first + 3                              # the second copy is drafted from the global trie


def test_arctic_cache_when_built():
    """Runs where `build_arctic` has built the extension (skipped elsewhere: building
    downloads the sdist): a repeated request is drafted from Arctic's global tree, and
    its proposals respect the budget."""
    import sysconfig
    from benchmarks.arctic_peer import WORKDIR, ARCTIC_VERSION, ArcticPeer, load_arctic
    root = WORKDIR / f"arctic_inference-{ARCTIC_VERSION}"
    if not (root / "arctic_inference" / "suffix_decoding" / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}").is_file():
        pytest.skip("Arctic's suffix-decoding extension is not built (python benchmarks/arctic_peer.py builds it)")
    module = load_arctic(root)
    stream = [([1, 2, 3], list(range(100, 160)))] * 2
    for tree in (False, True):
        peer = ArcticPeer(module, 8, tree)
        result = replay(peer, stream)
        first, second = result["tau_by_request"]
        assert second > first + 3 and result["verified_nodes_per_round"] <= 8
