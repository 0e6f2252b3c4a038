"""Cost models: the seconds a simulated round would take.

* `LinearCost` (OnlineSpec Theorem 1 / Leviathan et al. 2023 Section 3.4): drafting
  k tokens costs a*k seconds and one verification forward costs A seconds whatever
  the number of verified tokens, so a round costs a*k + A.
* `TableCost`: the verification forward's seconds read off a measured table of
  verify time against the number of verified tokens (linear interpolation /
  extrapolation, `specloop.theory.VerifyCostTable`); drafting still a per step.

`load_cost_table()` reads the table shipped with the package
(``specloop/sim/data/smollm2_135m_cpu_verify_cost.json``, measured on this machine
by ``benchmarks/verify_cost.py``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specloop.record import RoundRecord

__all__ = ["LinearCost", "TableCost", "load_cost_table", "DEFAULT_COST_TABLE", "round_record"]

DEFAULT_COST_TABLE = "smollm2_135m_cpu_verify_cost.json"


def _check_seconds(value: float, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value}")
    return value


class _CostModel:
    """What both cost models share: a seconds per draft step, the cost ratio a/A,
    and the argument checks. Subclasses give ``target_time`` (A) and
    ``_verify(verified_tokens)``."""

    draft_time: float
    target_time: float

    @property
    def cost_ratio(self) -> float:
        """OnlineSpec's a / A (Leviathan et al.'s c)."""
        return self.draft_time / self.target_time

    def draft_seconds(self, draft_steps: int) -> float:
        """Seconds to run ``draft_steps`` sequential draft forwards."""
        if draft_steps < 0:
            raise ValueError(f"draft_steps must be >= 0, got {draft_steps}")
        return self.draft_time * draft_steps

    def verify_seconds(self, verified_tokens: int) -> float:
        """Seconds of one verification forward over ``verified_tokens`` (>= 1) tokens."""
        if verified_tokens < 1:
            raise ValueError(f"verified_tokens must be >= 1, got {verified_tokens}")
        return self._verify(verified_tokens)


@dataclass(frozen=True)
class LinearCost(_CostModel):
    """Round time a*k + A.

    Attributes:
        draft_time: a, seconds per draft step (one drafted token / tree level).
        target_time: A, seconds per target forward (> 0).
    """

    draft_time: float = 0.05
    target_time: float = 1.0

    def __post_init__(self) -> None:
        _check_seconds(self.draft_time, "draft_time")
        if _check_seconds(self.target_time, "target_time") <= 0:
            raise ValueError("target_time must be > 0 seconds")

    def _verify(self, verified_tokens: int) -> float:
        return self.target_time  # A, whatever the number of verified tokens


@dataclass(frozen=True)
class TableCost(_CostModel):
    """Verify time from a measured table; draft time a per step.

    Attributes:
        table: callable num_tokens -> seconds (a `specloop.theory.VerifyCostTable`).
        draft_time: a, seconds per draft step.
    """

    table: object
    draft_time: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds(self.draft_time, "draft_time")
        if not callable(self.table):
            raise ValueError("TableCost.table must be callable: num_tokens -> seconds")

    @property
    def target_time(self) -> float:
        """A: seconds of a one-token forward (plain autoregressive decoding)."""
        return float(self.table(1))

    def _verify(self, verified_tokens: int) -> float:
        return float(self.table(verified_tokens))


def load_cost_table(path: str | Path | None = None, dtype: str = "float32"):
    """Load a verify-cost table JSON as a `specloop.theory.VerifyCostTable`.

    Args:
        path: a JSON file written by ``benchmarks/verify_cost.py``; None = the
            table shipped with the package.
        dtype: which measured column ("float32" or "bfloat16").

    Raises:
        FileNotFoundError: no such file. ValueError: malformed file or unknown dtype.
    """
    from specloop.theory import VerifyCostTable

    if path is None:
        text = resources.files("specloop.sim").joinpath("data", DEFAULT_COST_TABLE).read_text()
        where = DEFAULT_COST_TABLE
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"verify-cost table not found: {path}")
        text, where = path.read_text(), str(path)
    try:
        data = json.loads(text)
        tables = data["tables"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: not a verify-cost table ({exc})") from exc
    if dtype not in tables:
        raise ValueError(f"{where}: no {dtype!r} table; available: {sorted(tables)}")
    entry = tables[dtype]
    return VerifyCostTable(num_tokens=entry["num_tokens"], seconds=entry["seconds"])


def round_record(round_index: int, stream_index: int, num_draft_tokens: int, draft_steps: int,
                 verified_tokens: int, accepted: int, cost_model=None,
                 acceptance_probs=(), loss: float = float("nan"),
                 update_time: float = 0.0) -> RoundRecord:
    """Build a `RoundRecord` whose times come from ``cost_model`` (None = zero times).

    ``draft_steps`` sequential draft forwards cost ``cost_model.draft_seconds``; one
    verification forward over ``verified_tokens`` costs ``cost_model.verify_seconds``.
    """
    draft_time = verify_time = 0.0
    target_time = float("nan")
    if cost_model is not None:
        draft_time = cost_model.draft_seconds(draft_steps)
        verify_time = cost_model.verify_seconds(verified_tokens)
        target_time = cost_model.target_time
    return RoundRecord(round_index=round_index, stream_index=stream_index,
                       num_draft_tokens=num_draft_tokens, tree_depth=draft_steps,
                       verified_tokens=verified_tokens, accepted_tokens=accepted,
                       tokens_per_round=accepted + 1, draft_time=draft_time,
                       verify_time=verify_time, update_time=update_time,
                       acceptance_probs=tuple(float(a) for a in acceptance_probs), loss=loss,
                       target_time=target_time)
