"""The peer implementation of SuffixDecoding: Arctic Inference's ``SuffixDecodingCache``
(Oliaro et al., NeurIPS 2025; PyPI ``arctic-inference`` 0.3.0, C++ extension
``arctic_inference/suffix_decoding/_C`` over nanobind) against specloop's ``suffix``
drafter, fed the same token stream at the same verify budget.

Building (done here, CPU, x86_64, g++ 12.2, CMake 3.25, Python 3.11): the wheel needs
torch / vLLM, but the suffix-decoding extension is self-contained. `build_arctic`
downloads the sdist (``pip download arctic-inference==0.3.0 --no-deps --no-binary :all:
--no-build-isolation``; with build isolation pip times out installing the sdist's build
requirements, torch among them), installs only ``nanobind==2.9.2`` (the sdist's pinned
build requirement) into ``WORKDIR/nanobind``, configures
``csrc/suffix_decoding/CMakeLists.txt`` with CMake + Ninja (Release) and builds
``_C.cpython-*.so`` (about 30 s, 15 steps), copied next to the sdist's own
``arctic_inference/suffix_decoding/cache.py``; `load_arctic` imports that package from
the unpacked sdist (its top-level ``__init__`` imports nothing), so Arctic's Python and
C++ code run unmodified and no code of theirs is copied here. Nothing is installed into
the environment.

Replay. A stream is a list of (prompt, response) token lists: the committed responses
of a recorded run (greedy: the target's output does not depend on the draft). Each
peer serves the requests in order; a round proposes from the context (prompt +
response so far), is accepted greedily against the known continuation (the longest
drafted path the response continues), commits accepted + 1 tokens and feeds them back;
as in the decoder, a round drafts at most the tokens left - 1. Arctic is used as vLLM's proposer does: one
request id per request (``start_request`` with the prompt, ``add_active_response`` with
each round's committed tokens, ``stop_request`` at the end: the response stays in the
global tree, FIFO-evicted past ``max_cached_requests``), ``speculate`` on the last
``max_tree_depth`` context tokens with ``max_spec_tokens`` = the budget,
``max_spec_factor`` / ``min_token_prob`` its defaults (1.0 / 0.1), ``use_tree_spec`` for
trees. specloop's `SuffixDrafter` gets the same budget as the plan's k (chain) or
``verify_size`` (tree), with its cost rule (it may verify fewer nodes) or, with
``verify_cost="none"``, every node up to the budget.

Usage: python benchmarks/arctic_peer.py [--requests 100] [--budget 8] [--json PATH]
(a synthetic templated stream, `suffix_cost.synthetic_stream`; the stream benchmark
imports `compare` with recorded responses).
"""
from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch

from specloop.realmodels.drafters.base import DraftRequest
from specloop.realmodels.drafters.suffix import SuffixDrafter
from specloop.realmodels.sampling import SamplingConfig
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.strategies.hedge_sources import accepted_prefix

__all__ = ["ARCTIC_VERSION", "build_arctic", "load_arctic", "ArcticPeer", "SpecloopPeer", "replay", "compare"]

ARCTIC_VERSION = "0.3.0"
NANOBIND_VERSION = "2.9.2"
WORKDIR = Path("/tmp/arctic_peer")


def _run(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def build_arctic(workdir: Path = WORKDIR) -> Path:
    """Download the sdist and build its suffix-decoding extension under ``workdir``
    (idempotent); returns the unpacked sdist's root (module docstring).

    Raises:
        RuntimeError: a download / configure / build step failed (its output attached).
    """
    import os
    import sysconfig
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / f"arctic_inference-{ARCTIC_VERSION}"
    package = root / "arctic_inference" / "suffix_decoding"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if (package / f"_C{suffix}").is_file():
        return root
    sdist = workdir / f"arctic_inference-{ARCTIC_VERSION}.tar.gz"
    if not sdist.is_file():
        _run([sys.executable, "-m", "pip", "download", f"arctic-inference=={ARCTIC_VERSION}", "--no-deps",
              "--no-binary", ":all:", "--no-build-isolation", "-d", str(workdir)])
    if not root.is_dir():
        with tarfile.open(sdist) as tar:
            tar.extractall(workdir, filter="data")
    nanobind = workdir / "nanobind"
    if not (nanobind / "nanobind").is_dir():
        _run([sys.executable, "-m", "pip", "install", "--target", str(nanobind), f"nanobind=={NANOBIND_VERSION}"])
    build = workdir / "build"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    env = {**os.environ, "PYTHONPATH": str(nanobind)}
    _run(["cmake", str(root / "csrc" / "suffix_decoding"), "-G", "Ninja", f"-DPython_EXECUTABLE={sys.executable}",
          "-DCMAKE_BUILD_TYPE=Release"], cwd=build, env=env)
    _run(["ninja", "-j1"], cwd=build, env=env)
    shutil.copy2(build / f"_C{suffix}", package / f"_C{suffix}")
    return root


def load_arctic(root: Path):
    """``arctic_inference.suffix_decoding`` imported from the built sdist ``root``."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module("arctic_inference.suffix_decoding")


class ArcticPeer:
    """Arctic's `SuffixDecodingCache` behind the replay's interface (module docstring)."""

    def __init__(self, module, budget: int, tree: bool, max_tree_depth: int = 64,
                 max_cached_requests: int = 1000, max_spec_factor: float = 1.0, min_token_prob: float = 0.1):
        self.cache = module.SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        self.budget, self.tree = int(budget), bool(tree)
        self.options = {"max_spec_factor": max_spec_factor, "min_token_prob": min_token_prob}
        self.name = f"arctic-{'tree' if tree else 'chain'}"
        self._rid = -1
        self._ctx: list[int] = []

    def start(self, prompt: Sequence[int]) -> None:
        self._rid += 1
        self._ctx = list(prompt)
        self.cache.start_request(self._rid, list(prompt))

    def propose(self, max_tokens: int) -> tuple[list[int], list[int]]:
        if max_tokens < 1:                      # Arctic reads max_spec_tokens 0 as "the tree depth"
            return [], []
        draft = self.cache.speculate(self._rid, self._ctx[-self.cache.max_tree_depth:],
                                     max_spec_tokens=min(self.budget, max_tokens), use_tree_spec=self.tree,
                                     **self.options)
        return list(draft.token_ids), list(draft.parents)

    def commit(self, tokens: Sequence[int], finished: bool, accepted_nodes: tuple = ()) -> None:
        self.cache.add_active_response(self._rid, list(tokens))
        self._ctx.extend(tokens)
        if finished:
            self.cache.stop_request(self._rid)


class SpecloopPeer:
    """specloop's `SuffixDrafter` behind the same interface; ``verify_cost`` as the
    drafter's (None = the shipped table's cost rule, "none" = the whole budget)."""

    def __init__(self, budget: int, tree: bool, verify_cost=None, depth: int = 64, max_requests: int = 1000,
                 top_k: int = 4):
        self.drafter = SuffixDrafter(depth=depth, max_requests=max_requests, verify_cost=verify_cost)
        self.plan = DraftPlan(budget, TreePlan(top_k=top_k, max_depth=budget, verify_size=budget)) if tree \
            else DraftPlan(budget)
        self.name = f"specloop-{'tree' if tree else 'chain'}{'-full-budget' if verify_cost == 'none' else ''}"
        self._gen = torch.Generator()
        self._ids: list[int] = []
        self._proposal = None

    def start(self, prompt: Sequence[int]) -> None:
        self._ids = list(prompt)
        self.drafter.reset(torch.tensor(self._ids))

    def propose(self, max_tokens: int) -> tuple[list[int], list[int]]:
        request = DraftRequest(torch.tensor(self._ids), self.plan, max_tokens, SamplingConfig(0.0), self._gen)
        self._proposal = self.drafter.propose(request)
        return self._proposal.tokens.tolist(), self._proposal.parents.tolist()

    def commit(self, tokens: Sequence[int], finished: bool, accepted_nodes: tuple = ()) -> None:
        self.drafter.observe(SimpleNamespace(proposal=self._proposal, accepted_nodes=accepted_nodes,
                                             finished=finished, committed_tokens=torch.tensor(list(tokens))))
        self._ids.extend(tokens)


def _accepted_nodes(tokens: list[int], parents: list[int], truth: Sequence[int]) -> tuple[int, ...]:
    path, node = [], -1
    for tok in truth:
        nxt = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == tok), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return tuple(path)


def replay(peer, stream: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict:
    """Serve ``stream`` with ``peer`` (greedy acceptance against the known responses).

    Returns: ``mean_accepted_length`` (tau, committed tokens per round, bonus included),
    ``verified_nodes_per_round``, ``accepted_per_verified_node``, ``rounds``, ``tokens``,
    ``propose_us_mean``, ``tau_by_request`` (per request), ``accepted_at`` (response
    position -> accepted draft tokens of the round that started there).
    """
    rounds = nodes = accepted_total = tokens_total = 0
    propose_us, tau_by_request, accepted_at = [], [], []
    for prompt, response in stream:
        response = [int(t) for t in response]
        peer.start([int(t) for t in prompt])
        pos, req_rounds, at = 0, 0, {}
        while pos < len(response):
            t0 = time.perf_counter()
            toks, pars = peer.propose(len(response) - pos - 1)     # the decoder's cap: remaining - 1
            propose_us.append((time.perf_counter() - t0) * 1e6)
            accepted, _ = accepted_prefix(toks, pars, response[pos:])
            n = min(accepted + 1, len(response) - pos)
            at[pos] = accepted
            peer.commit(response[pos:pos + n], pos + n >= len(response), _accepted_nodes(toks, pars, response[pos:]))
            pos += n
            rounds, req_rounds, nodes = rounds + 1, req_rounds + 1, nodes + len(toks)
            accepted_total, tokens_total = accepted_total + min(accepted, n - 1), tokens_total + n
        tau_by_request.append(len(response) / req_rounds if req_rounds else float("nan"))
        accepted_at.append(at)
    return {"mean_accepted_length": tokens_total / rounds, "verified_nodes_per_round": nodes / rounds,
            "accepted_per_verified_node": accepted_total / nodes if nodes else 0.0, "rounds": rounds,
            "tokens": tokens_total, "propose_us_mean": statistics.fmean(propose_us),
            "tau_by_request": tau_by_request, "accepted_at": accepted_at}


def compare(stream, budget: int = 8, arctic_root: Path | None = None, trees: Sequence[bool] = (False, True)) -> dict:
    """Arctic and specloop (cost rule and full budget) on ``stream``, chain and tree.

    Returns: per peer name, `replay`'s summary without the per-position detail, plus
    ``common_positions`` (positions where both a peer and Arctic started a round) and
    ``mean_accepted_there`` / ``arctic_mean_accepted_there`` on them (the proposals
    compared at equal contexts).
    """
    module = load_arctic(arctic_root if arctic_root is not None else build_arctic())
    out = {}
    for tree in trees:
        arctic = replay(ArcticPeer(module, budget, tree), stream)
        peers = [SpecloopPeer(budget, tree), SpecloopPeer(budget, tree, verify_cost="none")]
        for name, result in [(f"arctic-{'tree' if tree else 'chain'}", arctic)] + \
                [(p.name, replay(p, stream)) for p in peers]:
            mine, theirs = [], []
            for ours, ref in zip(result["accepted_at"], arctic["accepted_at"]):
                for pos in ours.keys() & ref.keys():
                    mine.append(ours[pos])
                    theirs.append(ref[pos])
            row = {k: v for k, v in result.items() if k not in ("accepted_at", "tau_by_request")}
            row.update({"common_positions": len(mine), "mean_accepted_there": float(np.mean(mine)),
                        "arctic_mean_accepted_there": float(np.mean(theirs))})
            out[name] = row
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--budget", type=int, default=8, help="verify budget: nodes per round")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.budget < 1:
        print("arctic_peer: --requests and --budget must be >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from suffix_cost import synthetic_stream
    torch.set_num_threads(1)
    stream = synthetic_stream(args.requests, 200, 200)
    result = {"meta": {"arctic_inference": ARCTIC_VERSION, "requests": args.requests, "budget": args.budget,
                       "stream": "suffix_cost.synthetic_stream (70% spans of 20 shared templates)",
                       "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
              "results": compare(stream, args.budget, build_arctic(args.workdir))}
    text = json.dumps(result, indent=1)
    if args.json is not None:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
