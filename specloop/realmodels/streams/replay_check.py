"""Check a replay against the real decoder round for round
(``specloop stream check-replay``; docs/design.md, section "Replays").

For each method, the first N prompts of a recording are served twice by
`StreamRunner` with the same settings and seed: once by the real decoder
(`SpeculativeDecoder`, the target really runs) and once replayed
(`specloop.realmodels.streams.replay.ReplayDecoder`). Round r of prompt i *matches* when both
engines drafted the same number of tokens to the same depth and accepted and committed
the same numbers of tokens (``num_draft_tokens``, ``tree_depth``, ``accepted_tokens``,
``tokens_per_round``); rounds one engine has and the other lacks do not match. A
prompt is *divergent* when the real decoder's output left the recorded continuation
(batch-1 greedy decoding is not the recording's batched greedy decoding, e.g. in
bfloat16); its rounds are still compared.

Criterion (float32): at least 99 % of the real decoder's rounds match and the mean
accepted lengths agree within 1 % (relative); in bfloat16 the numbers are reported
and the criterion is not applied (batched and batch-1 bfloat16 logits differ).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

__all__ = ["round_key", "compare_traces", "check_replay", "MIN_MATCHING", "MAX_TAU_GAP"]

MIN_MATCHING = 0.99
MAX_TAU_GAP = 0.01


def round_key(record) -> tuple:
    """What must agree between the decoder's and the replay's round: (draft tokens,
    tree depth, accepted draft tokens, committed tokens)."""
    return (record.num_draft_tokens, record.tree_depth, record.accepted_tokens, record.tokens_per_round)


def compare_traces(real, replay) -> dict:
    """Round-by-round comparison of two traces of the same prompts.

    Args:
        real, replay: `specloop.record.Trace` s (records carry ``stream_index`` and
            ``round_index``).

    Returns:
        dict: ``rounds`` (the real decoder's), ``matching_rounds``, ``tau_real``,
        ``tau_replay`` (mean committed tokens per round), ``tau_gap`` (relative),
        ``differences`` (the first 20 non-matching rounds: stream_index, round_index,
        real and replay keys or None).
    """
    def by_prompt(trace):
        out: dict[int, list] = {}
        for record in trace:
            out.setdefault(int(record.stream_index), []).append(record)
        return out

    a, b = by_prompt(real), by_prompt(replay)
    matching, differences = 0, []
    for index in sorted(set(a) | set(b)):
        rows_a, rows_b = a.get(index, []), b.get(index, [])
        for r in range(max(len(rows_a), len(rows_b))):
            key_a = round_key(rows_a[r]) if r < len(rows_a) else None
            key_b = round_key(rows_b[r]) if r < len(rows_b) else None
            if key_a is not None and key_a == key_b:
                matching += 1
            elif len(differences) < 20:
                differences.append({"stream_index": index, "round_index": r, "real": key_a, "replay": key_b})
    tau = (lambda t: sum(x.tokens_per_round for x in t) / len(t) if len(t) else math.nan)
    tau_real, tau_replay = tau(real), tau(replay)
    return {"rounds": len(real), "matching_rounds": matching, "tau_real": tau_real, "tau_replay": tau_replay,
            "tau_gap": abs(tau_replay - tau_real) / tau_real if tau_real else math.nan,
            "differences": differences}


def _divergent(recording, outputs: list[list[int]], max_new_tokens: int) -> list[dict]:
    """Prompts whose real output leaves the recorded continuation (first differing token)."""
    from specloop.realmodels.recording import first_difference
    out = []
    for index, tokens in enumerate(outputs):
        record = recording.prompt(index)
        recorded = [int(t) for t in record["tokens"][record["prompt_length"]:]][:max_new_tokens]
        if list(tokens) != recorded:
            out.append({"stream_index": index, "first_diff": first_difference(tokens, recorded)})
    return out


def check_replay(recording, target, methods, config, *, prompts: int = 10, verify_cost=None, drafts_dir=None,
                 out=None, progress=None, make_drafter=None) -> dict:
    """Serve the recording's first ``prompts`` prompts with every method by the real
    decoder and by the replay, and compare (module docstring).

    Args:
        recording: `recording.Recording`. target: the recorded target, loaded in
            the recording's dtype (`LoadedModel`).
        methods: method names (`specloop.realmodels.streams.runner.resolve_method`).
        config: `StreamConfig` (its ``max_new_tokens`` at most the recording's).
        prompts: prompts compared (>= 1). verify_cost: the replay's table.
        drafts_dir: as `StreamRunner`. out: folder for both runs' records (None = a
            temporary folder, removed after).
        progress: optional callable(1) after each served prompt (both engines).
        make_drafter: as `StreamRunner` (called once per method and engine; it must
            build the same draft every time).

    Returns:
        dict: ``methods`` -> `compare_traces` + ``divergent_prompts`` + ``passed``
        (None in bfloat16); ``rounds``, ``matching_rounds``, ``tau_replay``,
        ``tau_real`` and ``divergent_prompts`` summed / of the first method;
        ``passed`` (all methods); ``dtype``, ``prompts``.

    Raises:
        ValueError: unknown method, prompts out of range, a method that cannot run.
    """
    from specloop.realmodels.online import load_checkpoint
    from specloop.realmodels.streams.runner import StreamRunner, resolve_method
    from specloop.realmodels.recording import recorded_items
    from specloop.record import Trace
    items = recorded_items(recording, prompts)
    ids = [list(i.ids) for i in items]
    dtype = recording.settings["dtype"]
    temp = tempfile.TemporaryDirectory() if out is None else None
    folder = Path(temp.name if temp is not None else out)
    try:
        results = {}
        for name in methods:
            spec = resolve_method(name)
            traces, outputs = {}, None
            for engine in ("decoder", "replay"):
                runner = StreamRunner(target, ids, folder / engine, config, make_drafter, drafts_dir=drafts_dir,
                                      replay=recording if engine == "replay" else None, verify_cost=verify_cost)
                runner.run_method(spec.name, progress=progress)
                traces[engine] = Trace.load(folder / engine / spec.name / "rounds.jsonl")
                if engine == "decoder":
                    outputs = load_checkpoint(folder / engine / spec.name / "state.pt")["outputs"]
            row = compare_traces(traces["decoder"], traces["replay"])
            row["divergent_prompts"] = _divergent(recording, outputs, config.max_new_tokens)
            row["passed"] = (None if dtype != "float32" else
                             row["matching_rounds"] >= MIN_MATCHING * row["rounds"] and row["tau_gap"] <= MAX_TAU_GAP)
            results[spec.name] = row
    finally:
        if temp is not None:
            temp.cleanup()
    first = next(iter(results.values()))
    verdicts = [r["passed"] for r in results.values()]
    return {"dtype": dtype, "prompts": len(items), "methods": results,
            "rounds": sum(r["rounds"] for r in results.values()),
            "matching_rounds": sum(r["matching_rounds"] for r in results.values()),
            "tau_replay": first["tau_replay"], "tau_real": first["tau_real"],
            "divergent_prompts": first["divergent_prompts"],
            "passed": None if dtype != "float32" else all(verdicts),
            "criterion": {"min_matching": MIN_MATCHING, "max_tau_gap": MAX_TAU_GAP,
                          "applied": dtype == "float32"}}
