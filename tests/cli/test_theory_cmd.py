"""`specloop theory optimal-k` and `specloop theory check`."""
from __future__ import annotations

import json
from fractions import Fraction

import pytest

from specloop.cli import main
from specloop.theory import CLAIMS

OPTIMAL_K_KEYS = {"k_exact", "k_exact_appendix", "speedup_exact", "k_paper", "speedup_paper",
                  "efficiency"}


def _argmax(acc, ratio, shift, k_max=60):
    """Brute-force exact argmax (smallest maximiser) of (1 - a^(k+shift))/((1 - a)(ck + 1))."""
    a, c = Fraction(acc), Fraction(ratio)
    values = [(1 - a ** (k + shift)) / (1 - a) / (c * k + 1) for k in range(k_max)]
    best = max(values)
    return values.index(best)


def test_optimal_k_json(capsys):
    assert main(["theory", "optimal-k", "--acceptance-rate", "0.8", "--cost-ratio", "0.05",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert OPTIMAL_K_KEYS <= set(out)
    assert out["k_exact"] == _argmax(0.8, 0.05, 1) == 8
    assert out["k_exact_appendix"] == _argmax(0.8, 0.05, 0)
    assert out["speedup_exact"] == pytest.approx((1 - 0.8 ** 9) / 0.2 / 1.4)
    k_paper = out["k_paper"]
    big_c = -1 + 0.8 + (1 - 1.6 + 0.64 + 0.15 - 0.16 + 0.032) ** 0.5
    assert k_paper == pytest.approx(big_c / (0.05 * 0.2))
    k_round = int(k_paper + 0.5)
    assert out["speedup_paper"] == pytest.approx((1 - 0.8 ** (k_round + 1)) / 0.2 /
                                                 (1 + 0.05 * k_round))
    assert out["efficiency"] == pytest.approx(out["speedup_paper"] / out["speedup_exact"])


def test_optimal_k_table_and_errors(capsys):
    assert main(["theory", "optimal-k", "--acceptance-rate", "0.5", "--cost-ratio", "0.1"]) == 0
    assert "k_exact" in capsys.readouterr().out
    assert main(["theory", "optimal-k", "--acceptance-rate", "1.5", "--cost-ratio", "0.1"]) == 2
    assert "acceptance_rate" in capsys.readouterr().err
    assert main(["theory", "optimal-k", "--acceptance-rate", "0.5", "--cost-ratio", "-1"]) == 2
    assert main(["theory", "optimal-k", "--acceptance-rate", "1", "--cost-ratio", "0.1"]) == 2
    assert "k_max" in capsys.readouterr().err


def test_optimal_k_capped_json_is_strict(capsys):
    assert main(["theory", "optimal-k", "--acceptance-rate", "1", "--cost-ratio", "0.1",
                 "--k-max", "12", "--json"]) == 0
    text = capsys.readouterr().out
    out = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert out["k_exact"] == 12 and out["k_paper"] == "inf" and out["efficiency"] == 1.0


def test_check_json(capsys):
    assert main(["theory", "check", "--json", "--seed", "1", "--cases-per-family", "2"]) == 0
    rows = json.loads(capsys.readouterr().out,
                      parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert [row["claim"] for row in rows] == list(CLAIMS)
    for row in rows:
        assert {"claim", "holds", "cases", "violations", "worst_ratio", "counterexample"} <= set(row)
        assert row["holds"] == (row["violations"] == 0)
    by_claim = {row["claim"]: row for row in rows}
    assert by_claim["lemma1_tokens_committed"]["holds"]
    assert not by_claim["lemma1_accepted_only"]["holds"]


def test_check_table(capsys):
    assert main(["theory", "check", "--cases-per-family", "1"]) == 0
    out = capsys.readouterr().out
    for claim in CLAIMS:
        assert claim in out
    with pytest.raises(SystemExit):
        main(["theory", "check", "--cases-per-family", "0"])
