"""`specloop simulate`, cost models, the engine's contracts and bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from specloop.cli import main
from specloop.record import Trace
from specloop.sim.costs import LinearCost, TableCost, load_cost_table
from specloop.sim.drafts import NoisyDraft, ParametricDraft
from specloop.sim.engine import autoregressive_trace, run_chain, speedup_vs_autoregressive
from specloop.sim.rounds import chain_round, simulate_chain_tables, simulate_iid_chain
from specloop.sim.streams import make_stream
from specloop.sim.trees import simulate_tree_tables, tree_round
from specloop.strategies.base import DraftPlan, TreePlan
from specloop.theory import VerifyCostTable

KEYS = {"mean_tokens_per_round", "theory_tokens_per_round", "standard_error", "acceptance_rate",
        "rounds", "seconds"}


def _run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr()


def test_simulate_chain_json_and_trace(capsys, tmp_path):
    trace_file = tmp_path / "trace.jsonl"
    code, out = _run(capsys, "simulate", "chain", "--vocab", "300", "--k", "3", "--scenario",
                     "stationary", "--rounds", "3000", "--seed", "1", "--iid", "--json",
                     "--trace", str(trace_file), "--check")
    assert code == 0
    report = json.loads(out.out)
    assert KEYS <= set(report)
    assert report["rounds"] == 3000 and report["num_draft_tokens"] == 3 and report["theory_exact"]
    assert abs(report["mean_tokens_per_round"] - report["theory_tokens_per_round"]) \
        <= 4 * report["standard_error"]
    trace = Trace.load(trace_file)
    assert len(trace) == 3000
    assert trace.mean_accepted_length() == pytest.approx(report["mean_tokens_per_round"])
    assert report["speedup"] == pytest.approx(
        report["mean_tokens_per_round"] / (1 + 0.05 * 3))
    assert report["speedup"] == pytest.approx(
        speedup_vs_autoregressive(trace, LinearCost(0.05, 1.0)))
    assert report["simulated_seconds"] == pytest.approx(trace.total_time)


@pytest.mark.parametrize("shape_args", [["--tree", "2,2"],
                                        ["--top-k", "3", "--depth", "3", "--verify-size", "8"]])
def test_simulate_tree_json(capsys, shape_args):
    code, out = _run(capsys, "simulate", "tree", "--vocab", "100", *shape_args, "--scenario",
                     "piecewise", "--rounds", "400", "--iid", "--json", "--check")
    assert code == 0
    report = json.loads(out.out)
    assert KEYS <= set(report) and report["theory_tokens_per_round"] is not None
    assert report["mean_tokens_per_round"] >= 1.0


def test_simulate_table_cost_and_scenarios(capsys):
    code, out = _run(capsys, "simulate", "chain", "--vocab", "64", "--k", "2", "--scenario",
                     "trained-target", "--rounds", "200", "--cost", "table", "--draft-time",
                     "0.002", "--json")
    assert code == 0
    report = json.loads(out.out)
    assert report["cost_model"]["kind"] == "table" and report["speedup"] > 0


@pytest.mark.parametrize("argv, message", [
    (["simulate", "chain", "--vocab", "1"], "vocab_size"),
    (["simulate", "tree", "--vocab", "50"], "exactly one of --tree"),
    (["simulate", "tree", "--top-k", "2"], "--depth"),
    (["simulate", "chain", "--cost", "table", "--cost-table", "/nonexistent.json"], "--cost-table /nonexistent.json: no such file"),
])
def test_simulate_bad_input_exits_2(capsys, argv, message):
    code, out = _run(capsys, *argv, "--rounds", "10")
    assert code == 2 and message in out.err


def test_simulate_argparse_rejects_negative_k(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "chain", "--k", "-1"])
    assert exc.value.code == 2


def test_cost_models():
    linear = LinearCost(draft_time=0.1, target_time=2.0)
    assert linear.cost_ratio == pytest.approx(0.05)
    assert linear.draft_seconds(3) == pytest.approx(0.3) and linear.verify_seconds(17) == 2.0
    table = TableCost(VerifyCostTable([1, 4, 8], [0.03, 0.05, 0.06]), draft_time=0.01)
    assert table.target_time == pytest.approx(0.03)
    assert table.verify_seconds(6) == pytest.approx(0.055)
    with pytest.raises(ValueError):
        LinearCost(draft_time=-1.0)
    with pytest.raises(ValueError):
        LinearCost(target_time=0.0)
    with pytest.raises(ValueError):
        linear.verify_seconds(0)


def test_shipped_cost_table_loads_and_grows():
    for dtype in ("float32", "bfloat16"):
        table = load_cost_table(dtype=dtype)
        assert table.num_tokens[0] == 1 and table.num_tokens[-1] >= 16
        assert 0.001 < float(table(1)) < 1.0          # seconds per forward on a CPU
        assert float(table(16)) >= 0.8 * float(table(1))  # more tokens never much cheaper
    with pytest.raises(ValueError, match="no 'int8' table"):
        load_cost_table(dtype="int8")
    with pytest.raises(FileNotFoundError):
        load_cost_table("/no/such/table.json")


def test_chain_round_record_fields_and_bad_input():
    rng = np.random.default_rng(0)
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    record, tokens = chain_round(p, q, 3, rng, cost_model=LinearCost(0.1, 1.0), round_index=7,
                                 return_tokens=True)
    assert record.round_index == 7 and record.num_draft_tokens == 3 and record.verified_tokens == 4
    assert record.tokens_per_round == record.accepted_tokens + 1 == tokens.size
    assert len(record.acceptance_probs) == min(record.accepted_tokens + 1, 3)
    assert record.acceptance_probs[0] == pytest.approx(0.6)
    zero = chain_round(p, q, 0, rng)
    assert zero.tokens_per_round == 1 and zero.verified_tokens == 1
    with pytest.raises(ValueError, match="k"):
        chain_round(p, q, -1, rng)
    with pytest.raises(ValueError, match="NaN"):
        chain_round(np.array([np.nan, 1.0]), q, 2, rng)
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        chain_round(p, np.array([0.2, 0.3, 0.5]), 2, rng)
    with pytest.raises(ValueError, match="sums to"):
        chain_round(np.array([0.5, 0.6]), q, 2, rng)
    with pytest.raises(ValueError, match="q_draft = 0"):
        chain_round(p, np.array([1.0, 0.0]), 1, rng, draft_tokens=[1])
    with pytest.raises(ValueError, match="mode"):
        chain_round(p, q, 1, rng, mode="beam")
    with pytest.raises(ValueError, match="acceptance_rate"):
        simulate_iid_chain(1.5, 3, 10, rng)
    with pytest.raises(ValueError, match="contexts"):
        simulate_chain_tables(p, q, [1], 2, rng)


def test_tree_round_and_sampled_proposal_with_budget_is_refused():
    rng = np.random.default_rng(0)
    p, q = np.array([0.2, 0.3, 0.5]), np.array([0.3, 0.3, 0.4])
    record = tree_round(p, q, TreePlan(branching=(2, 2)), rng, cost_model=LinearCost(0.1, 1.0))
    assert record.num_draft_tokens == 6 and record.tree_depth == 2
    assert record.verified_tokens == 7 and record.draft_time == pytest.approx(0.2)
    with pytest.raises(ValueError, match="deterministic"):
        simulate_tree_tables(p, q, [0], TreePlan(branching=(2, 2), verify_size=3), rng,
                             proposal="iid")
    budget = simulate_tree_tables(p, q, [0] * 5, TreePlan(top_k=3, max_depth=3, verify_size=5), rng)
    assert (budget.num_nodes == 5).all()


class _Fixed:
    def __init__(self, plans):
        self.plans, self.states = plans, []

    def plan(self, state):
        self.states.append(state)
        return self.plans[len(self.states) % len(self.plans)]

    def observe(self, record):
        pass


def test_engine_context_length_trees_learning_and_errors():
    stream = make_stream("fast", 50, 60, seed=0, num_contexts=3)
    policy = _Fixed([DraftPlan(2), DraftPlan(0, TreePlan(branching=(2, 1)))])
    trace = run_chain(stream, NoisyDraft(stream, 0.5), policy, rng=0, cost_model=LinearCost(0.1, 1.0))
    lengths = [s.context_length for s in policy.states]
    assert lengths[1:] == list(np.cumsum(trace.column("tokens_per_round"))[:-1].astype(int))
    assert {r.num_draft_tokens for r in trace} == {2, 4}  # chain k=2; tree 2 + 2*1 nodes
    base = autoregressive_trace(trace.total_tokens, LinearCost(0.1, 1.0))
    assert trace.speedup(base) == pytest.approx(speedup_vs_autoregressive(trace, LinearCost(0.1, 1.0)))
    draft = ParametricDraft(50, 3, rank=1)
    with pytest.raises(ValueError, match="params"):
        run_chain(stream, draft, _Fixed([DraftPlan(1)]), rng=0)
    with pytest.raises(ValueError, match="rounds"):
        run_chain(stream, NoisyDraft(stream), _Fixed([DraftPlan(1)]), rounds=61)
    with pytest.raises(ValueError, match="ParametricDraft"):
        run_chain(stream, NoisyDraft(stream), _Fixed([DraftPlan(1)]), learner=object())
    with pytest.raises(ValueError, match="vocabulary"):
        run_chain(stream, np.ones(10) / 10, _Fixed([DraftPlan(1)]))
