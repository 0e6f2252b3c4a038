"""The stream runner: serve a prompt stream with frozen and online-adapted drafts
(OnlineSpec Table 1 rows) and a plain-decoding baseline, resumably.

Methods (case-insensitive names; `METHODS`): a drafter kind plus an optional online
learner of `specloop.strategies` (see `specloop.realmodels.online`):

=================  ============  =====================================================
method             drafter       learner
=================  ============  =====================================================
vanilla-sd         small-lm      frozen (Vanilla SD)
osd                small-lm      OSD distillation (Liu et al. 2024)
hydra / medusa     hydra/medusa  frozen
osd-<kind>         <kind>        OSD distillation
ogd-<kind>         <kind>        projected OGD (Online-LR, Sec. 3.1)
opt-<kind>         <kind>        optimistic OGD, Eq. 3 (Opt-Hydra, Sec. 3.2)
ens-<kind>         <kind>        Hedge ensemble, N=3, epsilon=10 (Ens-EAGLE, Sec. 3.3)
optens-<kind>      <kind>        optimism + ensemble (App. C.3)
eagle / eagle3     eagle/eagle3  frozen (and the online variants above)
<kind>+suffix      hybrid        frozen head, the suffix tree where it is confident
<prefix>-<kind>+suffix  hybrid   the online head above, the same suffix tree
suffix             suffix        the suffix tree alone (SuffixDecoding)
=================  ============  =====================================================

A ``+suffix`` method drafts with the suffix tree (which learns from every committed
token of the stream without a gradient) when its proposal's expected accepted tokens
reach `SUFFIX_MIN_SCORE`, else with the head (`specloop.realmodels.heads.hybrid`);
online learning trains the head alone, the tries are kept with the stream's state.

``greedy`` is the baseline: the same decoder with no draft (one target forward per
token, same KV-cache code path), whose tokens/s is the denominator of every
``speedup``.

Results folder (``out``): per method ``<method>/rounds.jsonl`` (a `TraceWriter`
file, one `RoundRecord` per round, ``stream_index`` = prompt index; online
methods' records carry the round's f_t(w_t) in ``loss``, returned by `OnlineDrafter.observe`),
``<method>/state.pt`` (prompts done, per-prompt and per-chunk timings, the adapter's
full state: draft parameters, learner, replay buffer; for the suffix method the
drafter's own state) written atomically after every prompt for a frozen draft, and for
a method with learned state at chunk ends, after the run's last prompt and otherwise
once ``state_every_s`` seconds have passed, and ``<method>/chunks.json`` (per-chunk
summaries). A killed run restarted with the same arguments drops the rounds of the
prompts after the last state write, reloads the state and serves them again: the
records equal those of an uninterrupted run (greedy decoding).
With ``snapshot_chunks`` an online method also keeps ``<method>/chunk-NNN.pt``
(`chunk_snapshot_path`), the draft's trainable parameters at the end of chunk NNN
(for the held-out analysis of `specloop.realmodels.streams.online_heldout`); nothing else
changes.

Engines: the real decoder (`SpeculativeDecoder`), or, given a recording of the stream
(``replay=``, `specloop.realmodels.recording`), the replay
(`specloop.realmodels.streams.replay.ReplayDecoder`): the same drafters, learners, updates
and round loop against the recorded target side, verification priced from a cost
table. A results folder belongs to one engine (a resumed run on the other is refused).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


from specloop._folder_lock import folder_lock
from specloop.realmodels.drafters.base import NoDraft
from specloop.realmodels.online import (OnlineAdapter, OnlineConfig, OnlineDrafter, load_checkpoint,
                                        save_checkpoint)
from specloop.record import Trace, TraceWriter
from specloop.strategies.registry import learner_spec

__all__ = ["MethodSpec", "METHODS", "resolve_method", "frozen_method", "SUFFIX_MIN_SCORE", "StreamConfig",
           "StreamRunner", "summarise",
           "BASELINE", "chunk_snapshot_path", "online_drafter"]

BASELINE = "greedy"
_KINDS = {"hydra": "Hydra", "medusa": "Medusa", "eagle": "EAGLE", "eagle3": "EAGLE-3"}
#: method prefix -> (registered learner name, the paper's label prefix); `specloop.strategies.registry`
_LEARNERS = {learner_spec(p).short: (learner_spec(p).name, learner_spec(p).label)
             for p in ("osd", "ogd", "optimistic", "ensemble", "optimistic-ensemble")}


@dataclass(frozen=True)
class MethodSpec:
    """One row of the methods table.

    Attributes:
        name: canonical key (lower case), e.g. "opt-hydra".
        label: the paper's name, e.g. "Opt-Hydra".
        drafter: drafter registry name ("" for the no-draft baseline).
        learner: registered online learner name (`specloop.strategies.registry`,
            e.g. "optimistic") or None for a frozen draft.
        drafter_options: the drafter's options as (name, value) pairs (e.g. a hybrid's
            head and lookup); () = its defaults.
    """

    name: str
    label: str
    drafter: str
    learner: str | None
    drafter_options: tuple = ()

    @property
    def draft_kind(self) -> str:
        """The trained draft it reads (a hybrid's head): the ``--drafts`` sub-folder."""
        return str(dict(self.drafter_options).get("head", self.drafter))


#: expected accepted tokens (sum of the proposal's empirical path probabilities) a suffix
#: proposal needs in a ``+suffix`` method; the shipped heads accept 0.7-0.9 tokens a round
#: at k = 4 (tau 1.7-1.9), and the tries' counts are optimistic, hence a little above
SUFFIX_MIN_SCORE = 1.0


def _suffix_hybrid(kind: str) -> tuple:
    return (("head", kind), ("lookup", "suffix"), ("min_score", SUFFIX_MIN_SCORE))


def _hedge_sources_drafter() -> str:
    from specloop.realmodels.drafters.hedge import HEDGE_SOURCES_DRAFTER
    return HEDGE_SOURCES_DRAFTER


def _build_methods() -> dict[str, MethodSpec]:
    table = {BASELINE: MethodSpec(BASELINE, "Greedy (no draft)", "", None),
             "vanilla-sd": MethodSpec("vanilla-sd", "Vanilla SD", "small-lm", None),
             "osd": MethodSpec("osd", "OSD", "small-lm", "osd"),
             # a draft that learns from every verified token without a gradient:
             # its suffix tries are kept with the stream's state
             "suffix": MethodSpec("suffix", "SuffixDecoding", "suffix", None),
             # Hedge over suffix + n-gram, drafting priced at fixed seconds per proposal so a
             # resumed run reproduces the records (`drafters.hedge` docstring); state kept too
             "hedge-sources": MethodSpec("hedge-sources", "Hedge (sources)", _hedge_sources_drafter(), None)}
    for kind, label in _KINDS.items():
        table[kind] = MethodSpec(kind, label, kind, None)
        table[f"{kind}+suffix"] = MethodSpec(f"{kind}+suffix", f"{label} + suffix", "hybrid", None,
                                             _suffix_hybrid(kind))
        for prefix, (learner, plabel) in _LEARNERS.items():
            table[f"{prefix}-{kind}"] = MethodSpec(f"{prefix}-{kind}", f"{plabel}-{label}", kind, learner)
            table[f"{prefix}-{kind}+suffix"] = MethodSpec(f"{prefix}-{kind}+suffix", f"{plabel}-{label} + suffix",
                                                          "hybrid", learner, _suffix_hybrid(kind))
    return table


def frozen_method(spec: MethodSpec) -> str | None:
    """The frozen method with ``spec``'s draft (same drafter and options): the
    reference of an online method's paired gain; None if the table has none."""
    return next((m.name for m in METHODS.values() if m.drafter == spec.drafter
                 and m.drafter_options == spec.drafter_options and m.learner is None), None)


METHODS: dict[str, MethodSpec] = _build_methods()


def resolve_method(name: str) -> MethodSpec:
    """Look up a method by key or label (case-insensitive; "EAGLE-3" = "eagle3").

    Raises:
        ValueError: unknown method (lists the known ones).
    """
    key = name.strip().lower().replace("_", "-").replace("eagle-3", "eagle3").replace("vanilla sd", "vanilla-sd")
    key = key.replace("opt-ens-", "optens-").replace("optens+", "optens-")
    if key in METHODS:
        return METHODS[key]
    for spec in METHODS.values():
        if spec.label.lower() == name.strip().lower():
            return spec
    raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")


def online_drafter(inner, spec: MethodSpec, online: dict, seed: int):
    """``inner`` wrapped as the online method ``spec`` (its learner, with the
    `OnlineConfig` fields ``online`` and ``seed``), starting from ``inner``'s
    parameters: (`OnlineDrafter`, its `OnlineAdapter`).

    Raises:
        ValueError: a frozen method, or invalid ``online`` fields (`OnlineConfig`)."""
    if spec.learner is None:
        raise ValueError(f"{spec.label} is a frozen draft: it has no learner")
    adapter = OnlineAdapter(inner, OnlineConfig(**{**online, "learner": spec.learner, "seed": int(seed)}))
    return OnlineDrafter(inner, adapter), adapter


@dataclass(frozen=True)
class StreamConfig:
    """Settings shared by every method of one stream run.

    Attributes:
        chunk: prompts per chunk (>= 1).
        max_new_tokens: generation cap per prompt (>= 1).
        num_draft_tokens: chain length k per round (>= 1).
        online: `OnlineConfig` fields shared by the online methods (the learner kind
            comes from the method).
        seed: decoder seed (per prompt: seed + prompt index).
    """

    chunk: int = 4
    max_new_tokens: int = 96
    num_draft_tokens: int = 4
    online: dict = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("chunk", "max_new_tokens", "num_draft_tokens"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"StreamConfig.{name} must be >= 1, got {getattr(self, name)}")


DrafterFactory = Callable[[MethodSpec], object]


class StreamRunner:
    """Serve ``prompts`` (lists of target token ids) with each method, resumably.

    Args:
        target: `LoadedModel` (or a transformers causal LM).
        prompts: the stream, list of int lists (in order).
        out: results folder.
        config: `StreamConfig`.
        make_drafter: ``factory(spec) -> Drafter`` for frozen/inner drafters; default
            the drafter registry (saved drafts only: never trains at run time).
        drafts_dir: with the default factory, read each method's draft from
            ``drafts_dir/<drafter>`` (the folder ``specloop draft train --out
            drafts_dir/<drafter>`` writes) instead of the draft cache or the
            shipped copy, e.g. drafts trained on another corpus mix for a
            domain-shift stream; a missing folder fails that method with
            FileNotFoundError (it never falls back to another draft).
        replay: a `recording.Recording` of this stream: every method is replayed
            against it (`specloop.realmodels.streams.replay.ReplayDecoder`, greedy; the
            drafts, learners and updates really run, the target's verification is
            priced from ``verify_cost``) instead of decoded; ``prompts`` must be its
            first prompts.
        verify_cost: the replay's `VerifyCostTable` (None = the shipped table of the
            recording's dtype).
        replay_indices: the recording's index of each stream prompt (a sub-stream,
            `recording.recorded_items` with ``every``); None = prompt i is the
            recording's prompt i.
        state_every_s: how often a method that carries learned state (an online learner,
            a drafter that keeps stream state) rewrites ``state.pt``: after a prompt once
            this many seconds have passed since the last write, at every chunk end and
            after the run's last prompt (a frozen draft's small state is written after
            every prompt). A killed run resumes from the last write and serves the
            prompts since again, to the same records (greedy), so a kill costs at most
            about this long, and an Ens-EAGLE-3 state (279 MB) is not rewritten after every
            prompt. 0 = after every prompt.
        snapshot_chunks: an online method also writes `chunk_snapshot_path` files:
            after the last prompt of every chunk (and of the stream), its learner's
            played parameters (``adapter.params``, CPU copies) with ``chunk``,
            ``prompts_done``, ``num_steps`` and ``recorded_indices`` (the
            recording's index of each of the chunk's prompts). Written before
            ``state.pt``, so a resumed run rewrites the same files; records and
            summaries do not depend on it.

    Raises:
        ValueError: empty stream.
    """

    def __init__(self, target, prompts: list[list[int]], out: str | os.PathLike, config: StreamConfig,
                 make_drafter: DrafterFactory | None = None,
                 drafts_dir: str | os.PathLike | None = None, replay=None, verify_cost=None,
                 replay_indices: list[int] | None = None, snapshot_chunks: bool = False,
                 state_every_s: float = 300.0) -> None:
        if not prompts:
            raise ValueError("empty prompt stream")
        if replay is not None and config.online.get("background"):
            raise ValueError("a replay runs updates in the round loop (deterministic); price the background "
                             "variant (App. B.2, updates on another device) by the replay's speedup without "
                             "training instead of --background")
        self.replay, self.verify_cost = replay, verify_cost
        self.replay_indices = None if replay_indices is None else [int(i) for i in replay_indices]
        if self.replay_indices is not None and len(self.replay_indices) != len(prompts):
            raise ValueError(f"replay_indices has {len(self.replay_indices)} entries for {len(prompts)} prompts")
        self.engine = "decoder" if replay is None else "replay"
        self.target = target
        self.prompts = [list(map(int, p)) for p in prompts]
        self.out = Path(out)
        self.config = config
        self.make_drafter = make_drafter or self._registry_drafter
        self.drafts_dir = Path(drafts_dir) if drafts_dir is not None else None
        self.snapshot_chunks = bool(snapshot_chunks)
        if not (float(state_every_s) >= 0):
            raise ValueError(f"state_every_s must be >= 0 seconds, got {state_every_s}")
        self.state_every_s = float(state_every_s)

    def _registry_drafter(self, spec: MethodSpec):
        from specloop.realmodels.registry.drafters import make_drafter
        # a checkpoint folder is read as it is (`heads.common.load_draft` never falls back to the shipped copy)
        options = dict(spec.drafter_options)
        if self.drafts_dir is not None:
            options["checkpoint"] = str(self.drafts_dir / spec.draft_kind)
        try:
            return make_drafter(spec.drafter, self.target, train_if_missing=False, progress=False, **options)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"method {spec.label!r} needs a trained {spec.draft_kind!r} draft: {exc}") from exc

    def _build(self, spec: MethodSpec):
        if spec.name == BASELINE:
            return NoDraft(), None
        inner = self.make_drafter(spec)
        if spec.learner is None:
            return inner, None
        return online_drafter(inner, spec, self.config.online, self.config.seed)

    def _decoder(self, drafter, index: int):
        from specloop.realmodels.decoder import SpeculativeDecoder
        from specloop.realmodels.policy import FixedDraftPolicy
        if self.replay is not None:
            from specloop.realmodels.streams.replay import ReplayDecoder
            return ReplayDecoder(self.replay, self.target, drafter, policy=FixedDraftPolicy(self.config.num_draft_tokens),
                                 seed=self.config.seed + index, verify_cost=self.verify_cost,
                                 recorded_index=None if self.replay_indices is None else self.replay_indices.__getitem__)
        return SpeculativeDecoder(self.target, drafter, policy=FixedDraftPolicy(self.config.num_draft_tokens),
                                  seed=self.config.seed + index)

    def run_method(self, name: str, *, stop_after: int | None = None,
                   progress: Callable[[int], None] | None = None, deadline: float | None = None) -> dict:
        """Serve the stream with one method, resuming from its folder.

        Args:
            name: method name (`resolve_method`).
            stop_after: stop once this many prompts are done in total (simulates a
                kill; None = the whole stream).
            progress: called with 1 after each served prompt.
            deadline: wall-clock time (`time.time()`, seconds) after which no further
                prompt is started: the state is written after the prompt that ends past
                it and the run stops (``stopped_early`` in the summary); the same call
                resumes. None = no deadline.

        Returns:
            The method's summary (`summarise`).

        Raises:
            ValueError / FileNotFoundError: unknown method, missing draft, a
                checkpoint from different settings; `FolderInUseError` (a
                ValueError) when another live process is writing the method's folder.
        """
        spec = resolve_method(name)
        folder = self.out / spec.name
        with folder_lock(folder):                   # one writer per method folder
            return self._run_locked(spec, folder, stop_after, progress, deadline)

    def _run_locked(self, spec, folder: Path, stop_after, progress, deadline) -> dict:
        drafter, adapter = self._build(spec)
        state = self._load_state(folder, spec, adapter, _draft_id(drafter), drafter)
        done = state["prompts_done"]
        self._drop_unfinished(folder / "rounds.jsonl", done)
        limit = len(self.prompts) if stop_after is None else min(len(self.prompts), int(stop_after))
        self._saved_at = time.monotonic()
        try:
            with TraceWriter(folder / "rounds.jsonl", meta=self._meta(spec)) as writer:
                for index in range(done, limit):
                    if index == done and deadline is not None and time.time() >= deadline:
                        break                          # out of time before the first prompt
                    stop = self._serve(index, drafter, adapter, writer, state, last=index + 1 == limit,
                                       deadline=deadline)
                    if progress is not None:
                        progress(1)
                    if stop and index + 1 < limit:
                        break
        finally:
            if adapter is not None:
                adapter.close()
        summary = summarise(Trace.load(folder / "rounds.jsonl"), state, self.config.chunk, len(self.prompts))
        summary["stopped_early"] = summary["prompts_done"] < limit
        (folder / "chunks.json").write_text(json.dumps(summary["chunks"], indent=1), encoding="utf-8")
        return summary

    def _serve(self, index: int, drafter, adapter, writer: TraceWriter, state: dict, last: bool = True,
               deadline: float | None = None) -> bool:
        """Serve prompt ``index``, append its rounds and write the state when due.
        Returns whether the run stops after it (its last prompt or past ``deadline``;
        the state is written then)."""
        decoder = self._decoder(drafter, index)
        # online drafts return f_t(w_t) from observe: the session folds it into each
        # record's loss before the policy observes it
        result = decoder.generate(self.prompts[index], self.config.max_new_tokens, stream_index=index)
        for record in result.trace:
            writer.append(record)
        state["outputs"].append(list(result.new_tokens))
        state["prompts_done"] = index + 1
        if adapter is not None and (index + 1) % self.config.chunk == 0:
            state["chunk_train_time"].append(adapter.end_chunk())
        if adapter is not None and self.snapshot_chunks and \
                ((index + 1) % self.config.chunk == 0 or index + 1 == len(self.prompts)):
            self._save_snapshot(writer.path.parent, index, adapter)
        last = last or (deadline is not None and time.time() >= deadline)
        learned = adapter is not None or _keeps_stream_state(drafter)
        chunk_end = (index + 1) % self.config.chunk == 0
        if learned and not (last or chunk_end or time.monotonic() - self._saved_at >= self.state_every_s):
            return False                 # rewritten later; a kill before then serves these prompts again
        if adapter is not None:
            state["adapter"] = adapter.state_dict()
        if _keeps_stream_state(drafter):
            state["drafter"] = _stream_state_owner(drafter).state_dict()
        save_checkpoint(writer.path.parent / "state.pt", state)
        self._saved_at = time.monotonic()
        return last

    def _save_snapshot(self, folder: Path, index: int, adapter) -> None:
        """The ``snapshot_chunks`` file of the chunk that prompt ``index`` ends."""
        chunk = index // self.config.chunk
        first = chunk * self.config.chunk
        indices = self.replay_indices or list(range(len(self.prompts)))
        adapter.wait()
        save_checkpoint(chunk_snapshot_path(folder, chunk),
                        {"chunk": chunk, "prompts_done": index + 1, "num_steps": adapter.num_steps,
                         "params": [p.detach().cpu().clone() for p in adapter.params],
                         "recorded_indices": indices[first:index + 1]})

    def _meta(self, spec: MethodSpec) -> dict:
        return {"method": spec.name, "label": spec.label, "drafter": spec.drafter, "learner": spec.learner,
                "engine": self.engine,
                "config": {**self.config.__dict__}, "prompts": len(self.prompts)}

    def _load_state(self, folder: Path, spec: MethodSpec, adapter, draft_id: str, drafter=None) -> dict:
        path = folder / "state.pt"
        fresh = {"prompts_done": 0, "chunk_train_time": [], "outputs": [], "adapter": None,
                 "config": {**self.config.__dict__}, "method": spec.name, "stream_hash": self._stream_hash(),
                 "draft_id": draft_id, "engine": self.engine}
        if not path.is_file():
            return fresh
        state = load_checkpoint(path)
        if not _same_settings(state.get("config"), fresh["config"], spec.learner is not None) \
                or state.get("method") != spec.name or state.get("stream_hash") != fresh["stream_hash"] \
                or state.get("draft_id") != draft_id or state.get("engine", "decoder") != self.engine:
            raise ValueError(f"{path} was written with other settings, another prompt stream or "
                             "another saved draft (retrained since?) or the other engine (decoder / replay) "
                             f"({state.get('config')}); use another --out folder or delete it")
        if adapter is not None and state.get("adapter") is not None:
            adapter.load_state_dict(state["adapter"])
        if drafter is not None and _keeps_stream_state(drafter) and state.get("drafter") is not None:
            _stream_state_owner(drafter).load_state_dict(state["drafter"])
        return state

    def _stream_hash(self) -> str:
        """SHA-256 of the prompt stream (token ids in order): a resumed run must
        serve the same prompts."""
        import hashlib
        return hashlib.sha256(json.dumps(self.prompts).encode()).hexdigest()

    @staticmethod
    def _drop_unfinished(path: Path, done: int) -> None:
        """Keep only rounds of the first ``done`` prompts (a killed prompt restarts)."""
        if not path.is_file():
            return
        trace = Trace.load(path)
        kept = Trace([r for r in trace if r.stream_index < done], trace.meta)
        if len(kept) != len(trace) or not path.read_text(encoding="utf-8").endswith("\n"):
            kept.save(path)


def chunk_snapshot_path(folder: str | os.PathLike, chunk: int) -> Path:
    """``folder/chunk-NNN.pt``: a method's snapshot at the end of chunk ``chunk``
    (`StreamRunner` ``snapshot_chunks``; NNN zero-padded to 3 digits)."""
    return Path(folder) / f"chunk-{int(chunk):03d}.pt"


def _stream_state_owner(drafter):
    """The drafter whose state grows over the stream without a learner (the suffix
    drafter, a hybrid with a suffix lookup; inside an online drafter too), or None.
    Such drafters declare ``keeps_stream_state``; the runner saves their
    ``state_dict`` with the stream's state so a resumed run continues from it."""
    for candidate in (drafter, getattr(drafter, "inner", None)):
        if candidate is not None and bool(getattr(candidate, "keeps_stream_state", False)):
            return candidate
    return None


def _keeps_stream_state(drafter) -> bool:
    """Whether `_stream_state_owner` finds one."""
    return _stream_state_owner(drafter) is not None


def _draft_id(drafter) -> str:
    """SHA-256 of the saved draft's training report (``drafter.train_report``, set by
    the registry loaders) so a resumed run notices a retrained draft; "" if none."""
    import hashlib
    inner = getattr(drafter, "inner", drafter)
    report = getattr(inner, "train_report", None)
    if not report:
        return ""
    return hashlib.sha256(json.dumps(report, sort_keys=True, default=str).encode()).hexdigest()


def _same_settings(saved: dict | None, current: dict, online: bool) -> bool:
    """Whether a checkpoint's settings match; the online settings matter only to
    methods that learn, and so does the chunk size (a frozen draft or the baseline
    produces the same rounds whatever they are, so it resumes across them)."""
    if saved is None:
        return False
    if online:
        return saved == current
    strip = (lambda d: {k: v for k, v in d.items() if k not in ("online", "chunk")})
    return strip(saved) == strip(current)


def summarise(trace: Trace, state: dict, chunk: int, num_prompts: int) -> dict:
    """Headline numbers of one method from its rounds and state.

    Returns a dict: ``mean_accepted_length`` (tau over all rounds), ``tokens``,
    ``decode_seconds`` (draft + verify), ``update_seconds`` (per-round updates +
    chunk-end training), ``tokens_per_s`` (training excluded),
    ``tokens_per_s_with_training``, ``prompts_done``, ``chunks`` (per chunk:
    mean_accepted_length, tokens_per_s, tokens_per_s_with_training, train_seconds),
    ``prompts`` (per prompt: index, rounds, tokens; `streams.compare.per_prompt_counts`).
    """
    from specloop.realmodels.streams.compare import per_prompt_counts
    chunk_train = list(state.get("chunk_train_time", []))
    chunks = []
    for c in range(math.ceil(num_prompts / chunk)):
        rows = [r for r in trace if c * chunk <= r.stream_index < (c + 1) * chunk]
        if not rows:
            continue
        tokens = sum(r.tokens_per_round for r in rows)
        decode = sum(r.draft_time + r.verify_time for r in rows)
        update = sum(r.update_time for r in rows) + (chunk_train[c] if c < len(chunk_train) else 0.0)
        chunks.append({"chunk": c, "rounds": len(rows), "tokens": tokens,
                       "mean_accepted_length": tokens / len(rows),
                       "tokens_per_s": tokens / decode if decode > 0 else math.nan,
                       "tokens_per_s_with_training": tokens / (decode + update) if decode + update > 0 else math.nan,
                       "train_seconds": update})
    tokens = sum(r.tokens_per_round for r in trace)
    decode = sum(r.draft_time + r.verify_time for r in trace)
    update = sum(r.update_time for r in trace) + sum(chunk_train)
    return {"mean_accepted_length": tokens / len(trace) if len(trace) else math.nan,
            "tokens": tokens, "rounds": len(trace), "decode_seconds": decode, "update_seconds": update,
            "tokens_per_s": tokens / decode if decode > 0 else math.nan,
            "tokens_per_s_with_training": tokens / (decode + update) if decode + update > 0 else math.nan,
            "prompts_done": int(state.get("prompts_done", 0)), "chunks": chunks,
            "prompts": per_prompt_counts(trace)}
