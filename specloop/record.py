"""The round record and `Trace`: the one contract that the simulator and the real
decoder share (docs/design.md, section "Contracts").

One `RoundRecord` describes one draft-and-verify cycle of Algorithm 1 of OnlineSpec
(draft -> verify -> feedback -> update). A `Trace` is an ordered sequence of records
with the summaries every figure needs (mean accepted length tau, acceptance rate,
tokens/s, speedup against a baseline trace) and a JSON Lines file format that a
running job appends to one round at a time, so that a killed run keeps every
completed round (`TraceWriter`, `Trace.load`).

Counting convention (stated once, used everywhere): ``accepted_tokens`` counts the
accepted *draft* tokens; ``tokens_per_round`` (n_t) counts the tokens *committed*
in the round, i.e. accepted draft tokens + 1 (the bonus or correction token), except
when generation stops inside the round (EOS or ``max_new_tokens``), where it can be
smaller. ``mean_accepted_length`` (tau) is the mean of n_t, as EAGLE reports it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

import numpy as np

__all__ = ["RoundRecord", "Trace", "TraceWriter", "TRACE_FORMAT_VERSION"]

TRACE_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One draft-and-verify cycle (OnlineSpec Algorithm 1, one iteration of t).

    Attributes:
        round_index: index t of the round within its stream (0-based, int).
        stream_index: index of the prompt / context stream the round belongs to.
        num_draft_tokens: draft tokens proposed (k for a chain; number of tree nodes
            for a tree), in tokens.
        tree_depth: depth of the drafted tree (equals ``num_draft_tokens`` for a
            chain; 0 when nothing was drafted).
        verified_tokens: tokens fed to the target in the verification forward
            (drafted tokens + the one committed-but-unverified input token), tokens.
        accepted_tokens: accepted draft tokens, in [0, tree_depth].
        tokens_per_round: committed tokens n_t (accepted + bonus/correction), >= 0.
        draft_time: wall-clock seconds spent drafting (device synchronised).
        verify_time: wall-clock seconds of the target's verification forward.
        update_time: wall-clock seconds of the learner / policy update (0 if none).
        acceptance_probs: the draft's per-position acceptance probability
            Acc_j = sum_x min(p_j(x), q_j(x)) at each verified position j (a chain's
            positions; a tree's accepted path and the first position past it, first
            child tried there); a point-mass draft gives p_j(x_j), greedy 0 / 1.
            Empty tuple when unknown.
        child_acceptance_ratios: min(1, p(x)/q(x)) of every drafted child the
            verifier tried, in the order tried (the real decoder's recursive
            rejection walk); empty where the engine has no tried children.
        loss: the loss f_t(w_t) the learner observed this round (NaN if none).
        target_time: optional seconds of one plain target forward measured in the
            same run (used for cost ratios); NaN if not measured.
    """

    round_index: int
    stream_index: int
    num_draft_tokens: int
    tree_depth: int
    verified_tokens: int
    accepted_tokens: int
    tokens_per_round: int
    draft_time: float = 0.0
    verify_time: float = 0.0
    update_time: float = 0.0
    acceptance_probs: tuple[float, ...] = field(default_factory=tuple)
    child_acceptance_ratios: tuple[float, ...] = field(default_factory=tuple)
    loss: float = math.nan
    target_time: float = math.nan

    def __post_init__(self) -> None:
        for name in ("num_draft_tokens", "tree_depth", "verified_tokens",
                     "accepted_tokens", "tokens_per_round"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"RoundRecord.{name} must be >= 0, got {getattr(self, name)}")
        if self.accepted_tokens > max(self.tree_depth, self.num_draft_tokens):
            raise ValueError(
                f"RoundRecord.accepted_tokens={self.accepted_tokens} exceeds the drafted "
                f"depth {self.tree_depth} / size {self.num_draft_tokens}")
        for name in ("draft_time", "verify_time", "update_time"):
            value = float(getattr(self, name))
            if not value >= 0.0:
                raise ValueError(f"RoundRecord.{name} must be a non-negative number of seconds, got {value}")
        for name in ("acceptance_probs", "child_acceptance_ratios"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(float(x) for x in getattr(self, name)))

    @property
    def round_time(self) -> float:
        """Seconds of the round: draft + verify + update."""
        return self.draft_time + self.verify_time + self.update_time

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (NaN written as null)."""
        out = dataclasses.asdict(self)
        out["acceptance_probs"] = [float(x) for x in self.acceptance_probs]
        out["child_acceptance_ratios"] = [float(x) for x in self.child_acceptance_ratios]
        for key in ("loss", "target_time"):
            if math.isnan(out[key]):
                out[key] = None
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "RoundRecord":
        """Inverse of `to_dict`; unknown keys raise ValueError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown RoundRecord fields: {sorted(unknown)}")
        kwargs = dict(data)
        for name in ("acceptance_probs", "child_acceptance_ratios"):
            kwargs[name] = tuple(float(x) for x in kwargs.get(name, ()))
        for key in ("loss", "target_time"):
            if kwargs.get(key) is None:
                kwargs[key] = math.nan
        return cls(**kwargs)


class Trace(Sequence[RoundRecord]):
    """An ordered sequence of `RoundRecord` with summaries and file I/O.

    Args:
        records: the rounds, in order.
        meta: free-form JSON-serialisable metadata (method, model, seed...).
    """

    def __init__(self, records: Iterable[RoundRecord] = (), meta: dict | None = None):
        self._records: list[RoundRecord] = list(records)
        self.meta: dict = dict(meta or {})

    # -- sequence protocol -------------------------------------------------
    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return Trace(self._records[index], self.meta)
        return self._records[index]

    def __iter__(self) -> Iterator[RoundRecord]:
        return iter(self._records)

    def append(self, record: RoundRecord) -> None:
        self._records.append(record)

    def column(self, name: str) -> np.ndarray:
        """One field over all rounds as a float64 array of shape (rounds,)."""
        return np.asarray([getattr(r, name) for r in self._records], dtype=np.float64)

    # -- summaries -----------------------------------------------------------
    def _require_rounds(self) -> None:
        if not self._records:
            raise ValueError("empty Trace: no rounds to summarise")

    @property
    def total_tokens(self) -> int:
        """Committed tokens over all rounds."""
        return int(sum(r.tokens_per_round for r in self._records))

    @property
    def total_time(self) -> float:
        """Seconds over all rounds (draft + verify + update)."""
        return float(sum(r.round_time for r in self._records))

    def mean_accepted_length(self) -> float:
        """tau: mean committed tokens per round n_t, bonus token included."""
        self._require_rounds()
        return float(self.column("tokens_per_round").mean())

    def acceptance_rate(self) -> float:
        """Empirical per-token acceptance rate: accepted / drafted-depth over rounds.

        For chains this is the fraction of drafted tokens accepted (each position is
        reached only after all earlier ones were accepted, so it is the maximum-
        likelihood estimate of Acc under Assumption 1 only when counted this way:
        accepted / (accepted + number of rejections)). A round rejected a draft token
        when it accepted fewer than it drafted and committed a correction token after
        them (n_t = accepted + 1); a round that stopped inside its accepted block (EOS
        or max_new_tokens: n_t = accepted) observed no rejection (censored).
        """
        self._require_rounds()
        accepted = self.column("accepted_tokens").sum()
        rejections = sum(1 for r in self._records
                         if r.accepted_tokens < r.tree_depth and r.tokens_per_round > r.accepted_tokens)
        denom = accepted + rejections
        return float(accepted / denom) if denom > 0 else 1.0

    def tokens_per_second(self, include_update: bool = True) -> float:
        """Committed tokens per wall-clock second (optionally excluding update time)."""
        self._require_rounds()
        seconds = self.total_time if include_update else float(
            sum(r.draft_time + r.verify_time for r in self._records))
        if seconds <= 0:
            raise ValueError("Trace has zero total time; tokens/s undefined")
        return self.total_tokens / seconds

    def speedup(self, baseline: "Trace", include_update: bool = True) -> float:
        """gamma: tokens/s of this trace over tokens/s of a baseline trace (plain
        autoregressive decoding of the same target), both measured in the same run."""
        return self.tokens_per_second(include_update) / baseline.tokens_per_second(include_update)

    def summary(self) -> dict:
        """A dict of the headline numbers (JSON-serialisable)."""
        self._require_rounds()
        return {
            "rounds": len(self),
            "total_tokens": self.total_tokens,
            "mean_accepted_length": self.mean_accepted_length(),
            "acceptance_rate": self.acceptance_rate(),
            "tokens_per_s": self.tokens_per_second() if self.total_time > 0 else math.nan,
        }

    # -- files --------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the whole trace as JSON Lines (header line + one line per round),
        atomically (temporary file then rename)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            _write_header(fh, self.meta)
            for record in self._records:
                fh.write(json.dumps(record.to_dict()) + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Trace":
        """Read a trace written by `save` or `TraceWriter`.

        A final line cut short by a killed writer is dropped; any other malformed
        line raises ValueError naming the line number.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a specloop trace, or a corrupt line before the last.
        """
        path = Path(path)
        lines = path.read_text(encoding="utf-8").splitlines()
        if not lines:
            raise ValueError(f"{path}: empty file, not a specloop trace")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: first line is not a specloop trace header") from exc
        if not isinstance(header, dict) or header.get("format") != "specloop-trace":
            raise ValueError(f"{path}: not a specloop trace (missing header)")
        records = []
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                records.append(RoundRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                if number == len(lines):  # torn final line of a killed run
                    break
                raise ValueError(f"{path}:{number}: corrupt round record: {exc}") from exc
        return cls(records, header.get("meta", {}))


def _write_header(fh: IO[str], meta: dict) -> None:
    fh.write(json.dumps({"format": "specloop-trace", "version": TRACE_FORMAT_VERSION,
                         "meta": meta}) + "\n")


class TraceWriter:
    """Append rounds to a trace file as they complete (resumable runs).

    Opening an existing file keeps its rounds (``writer.existing`` holds them, so a
    restarted run can skip what is done); a new file gets a header. Each `append`
    writes one line and flushes it, so a killed process loses at most the round in
    flight. Use as a context manager.
    """

    def __init__(self, path: str | os.PathLike, meta: dict | None = None, fsync: bool = False):
        self.path = Path(path)
        self.fsync = fsync
        if self.path.exists() and self.path.stat().st_size > 0:
            self.existing = Trace.load(self.path)
            self._truncate_torn_tail()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.existing = Trace([], meta)
            with open(self.path, "w", encoding="utf-8") as fh:
                _write_header(fh, meta or {})
        self._fh = open(self.path, "a", encoding="utf-8")

    def _truncate_torn_tail(self) -> None:
        """Rewrite the file if its last line was torn, so appends start clean."""
        text = self.path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):
            self.existing.save(self.path)

    def append(self, record: RoundRecord) -> None:
        self._fh.write(json.dumps(record.to_dict()) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
