"""Why an online draft does or does not beat its frozen draft: held-out measurements
chunk by chunk over a replayed stream.

A replayed stream (`specloop.realmodels.streams.runner` with ``replay=`` and
``snapshot_chunks``) leaves, per online method, ``rounds.jsonl`` and the draft's
trainable parameters at the end of every chunk c (`stream.chunk_snapshot_path`). With
the recording (`specloop.realmodels.recording`) that is enough to ask, per chunk:

* tau (`mean_accepted_length`, tokens per round, bonus included) of the online method
  and of its frozen draft, per chunk and per domain (from the two ``rounds.jsonl``);
* the positions the learner had received by the end of chunk c ("positions seen",
  reconstructed from the records: every round whose record carries a loss, i.e. gave
  the learner a sample, supervises min(n_t, K) positions, K the draft's depth cap;
  `FeatureHeadObjective.collect`);
* the draft's teacher-forced next-chunk loss: the cross-entropy (nats/token) and top-1
  agreement of the frozen draft, of the state before chunk c's updates (snapshot c-1;
  the frozen draft for c = 0) and after them (snapshot c), on the recorded
  continuation of chunk c+1's prompts, which none of these states has seen (for the
  stream's last chunk: the recording's next prompts of the (sub-)stream, when it has
  them; such rows say ``heldout_served`` False).

Held-out positions (`heldout_set`). For a prompt of L templated tokens and N recorded
positions (x_0 .. x_{N-1}, prompt then greedy continuation), the depth-d head at anchor
t reads the target feature h_t (the recorded last-layer ``hidden_last``), is fed the
true tokens x_{t+1} .. x_{t+d} (teacher forcing: Hydra's head j reads head j-1's
state and the token at depth j, exactly as drafting does) and predicts x_{t+d+1}.
Anchors: t in [max(0, L-2), N-2-d], i.e. labels t+1 .. t+d are all continuation
label positions (`recording_data`'s "continuation" rule and `RecordingSplit.anchor_pools`
within one prompt); t = L-2 is the first round's anchor (the decoder's pending token
is the prompt's last token, `FeatureHeadDrafter.reset`).

Losses (`evaluate_draft`), per depth d, from the draft's reduced-vocabulary logits:
``ce_greedy`` = mean -log q_draft(x_{t+d+1}) over anchors whose greedy token is in the
draft vocabulary (``greedy_in_vocab`` gives their share); ``ce_topm`` = mean
-sum_x p~(x) log q_draft(x) with p~ the recorded top-m p_target restricted to the draft
vocabulary and renormalised (the online objective's target, `samples.sparse_targets`;
anchors without in-vocabulary mass dropped); ``top1`` = share of anchors where the
draft's argmax is the greedy token (out-of-vocabulary tokens count as misses).

The in-domain offline reference (`offline_rows`): for each domain, the frozen draft
trained by the ``specloop draft train --from-recording`` code path
(`recording_data.RecordingSplit` anchors, `train_hydra.train_hydra_heads` /
`train_medusa.train_medusa_heads`) on exactly the stream prompts served by the end of
that domain's last chunk, then evaluated on the following chunk like the online state.

Only feature-head drafts (Hydra, Medusa) are measured; EAGLE heads are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

__all__ = ["HeldoutSet", "heldout_set", "evaluate_draft", "load_snapshot", "apply_snapshot", "rounds_by_chunk",
           "online_heldout", "offline_rows", "prompt_split"]

_EVAL_BATCH = 512               # anchors per forward


@dataclass(frozen=True)
class HeldoutSet:
    """Teacher-forced anchors of some recorded prompts, one entry per draft depth.

    Attributes:
        stream_indices: the recording's indices of the prompts.
        depths: d (1-based) -> dict of ``h`` float32 (n, H) recorded features h_t,
            ``tokens`` int64 (n, d) x_{t+1} .. x_{t+d}, ``greedy`` int64 (n,)
            x_{t+d+1}, ``topm_ids`` int64 (n, m) and ``topm_probs`` float32 (n, m)
            the recorded p_target of x_{t+d+1} (m = ``top_m`` or all recorded).
    """

    stream_indices: tuple[int, ...]
    depths: dict


def _last_layer(recording):
    """The key of the recorded last layer (-1 or ``num_hidden_layers``) in
    ``Recording.prompt(i)["hidden"]``.

    Raises:
        ValueError: the recording lacks it (a feature head reads it)."""
    n = int(recording.manifest.get("model", {}).get("num_hidden_layers", -2))
    for layer in recording.layers:
        if int(layer) in (-1, n):
            return layer
    raise ValueError(f"{recording.folder} lacks the last hidden layer that Hydra / Medusa heads read "
                     f"(recorded: {list(recording.layers)})")


def heldout_set(recording, stream_indices, max_depth: int, top_m: int | None = None) -> HeldoutSet:
    """The anchors of depths 1..``max_depth`` of recorded prompts (module docstring).

    Args:
        recording: a `recording.Recording`.
        stream_indices: the recording's indices of the prompts (ints).
        max_depth: deepest head measured (>= 1).
        top_m: recorded p_target tokens kept per label (None = all recorded).

    Raises:
        ValueError: max_depth < 1, no last layer recorded. IndexError: an index not
            in the recording.
    """
    if int(max_depth) < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    layer = _last_layer(recording)
    parts = {d: [] for d in range(1, int(max_depth) + 1)}
    for index in stream_indices:
        rec = recording.prompt(int(index))
        x = np.asarray(rec["tokens"], dtype=np.int64)
        length, n = int(rec["prompt_length"]), int(x.size)
        hidden, ids, probs = rec["hidden"][layer], rec["topm_ids"], rec["topm_probs"]
        m = ids.shape[1] if top_m is None else min(int(top_m), ids.shape[1])
        for d in parts:
            t = np.arange(max(0, length - 2), n - 1 - d)
            if t.size == 0:
                continue
            label = t + d
            parts[d].append((np.asarray(hidden[t], dtype=np.float32), x[t[:, None] + np.arange(1, d + 1)],
                             x[label + 1], np.asarray(ids[label, :m], dtype=np.int64),
                             np.asarray(probs[label, :m], dtype=np.float32)))
    depths = {}
    for d, rows in parts.items():
        if not rows:
            continue
        h, toks, greedy, ids, probs = (np.concatenate([r[i] for r in rows]) for i in range(5))
        depths[d] = {"h": torch.from_numpy(h), "tokens": torch.from_numpy(toks), "greedy": torch.from_numpy(greedy),
                     "topm_ids": torch.from_numpy(ids), "topm_probs": torch.from_numpy(probs)}
    return HeldoutSet(tuple(int(i) for i in stream_indices), depths)


def _feature_drafter(drafter):
    from specloop.realmodels.heads.head_drafting import FeatureHeadDrafter
    inner = getattr(drafter, "inner", drafter)
    if not isinstance(inner, FeatureHeadDrafter):
        raise ValueError(f"held-out losses are measured for feature-head drafts (hydra, medusa), not "
                         f"{getattr(inner, 'name', type(inner).__name__)!r}")
    return inner


@torch.no_grad()
def evaluate_draft(drafter, heldout: HeldoutSet) -> dict:
    """Teacher-forced losses of a feature-head draft on ``heldout`` at its current
    parameters (module docstring).

    Args:
        drafter: a `FeatureHeadDrafter` (Hydra / Medusa) or an `OnlineDrafter` around one.
        heldout: `heldout_set` output; depths above the draft's ``max_depth`` are skipped.

    Returns:
        ``{str(d): {"positions", "greedy_in_vocab", "ce_greedy", "ce_topm", "top1"}}``;
        ce_* in nats/token (NaN when no anchor counts), top1 and greedy_in_vocab
        fractions in [0, 1].

    Raises:
        ValueError: not a feature-head draft.
    """
    inner = _feature_drafter(drafter)
    t2d = inner.target_to_draft.cpu()
    d2t = inner.vocab.draft_to_target.cpu()
    out = {}
    for d, part in sorted(heldout.depths.items()):
        if d > inner.max_depth:
            continue
        sums = np.zeros(5)                     # ce_greedy, in_vocab, ce_topm, topm rows, top1
        n = int(part["greedy"].shape[0])
        for a in range(0, n, _EVAL_BATCH):
            b = slice(a, a + _EVAL_BATCH)
            logits = inner.unrolled_logits(part["h"][b], part["tokens"][b])[-1]
            logp = torch.log_softmax(logits.float().cpu(), -1)
            greedy = part["greedy"][b]
            row = t2d[greedy]
            inside = row >= 0
            sums[0] -= float(logp[inside, row[inside]].sum())
            sums[1] += int(inside.sum())
            rows = t2d[part["topm_ids"][b]]
            probs = part["topm_probs"][b] * (rows >= 0)
            mass = probs.sum(-1, keepdim=True)
            keep = mass[:, 0] > 0
            ce = -((probs / mass.clamp_min(1e-30)) * logp.gather(-1, rows.clamp_min(0))).sum(-1)
            sums[2] += float(ce[keep].sum())
            sums[3] += int(keep.sum())
            sums[4] += int((d2t[logp.argmax(-1)] == greedy).sum())
        out[str(d)] = {"positions": n, "greedy_in_vocab": float(sums[1] / n) if n else math.nan,
                       "ce_greedy": float(sums[0] / sums[1]) if sums[1] else math.nan,
                       "ce_topm": float(sums[2] / sums[3]) if sums[3] else math.nan,
                       "top1": float(sums[4] / n) if n else math.nan}
    return out


def load_snapshot(folder: str | Path, chunk: int) -> dict:
    """A method's ``chunk-NNN.pt`` (`stream.chunk_snapshot_path`): ``params`` (list of
    tensors), ``chunk``, ``prompts_done``, ``num_steps``, ``recorded_indices``.

    Raises:
        FileNotFoundError: no snapshot (the stream ran without ``--snapshot-chunks``,
            or has not finished that chunk).
    """
    from specloop.realmodels.streams.runner import chunk_snapshot_path
    path = chunk_snapshot_path(folder, chunk)
    if not path.is_file():
        raise FileNotFoundError(f"no snapshot {path}: run 'specloop stream' with --snapshot-chunks "
                                "(a resumed run only writes the chunks it serves)")
    return torch.load(path, weights_only=False)


@torch.no_grad()
def apply_snapshot(drafter, params) -> None:
    """Write ``params`` (tensors, in ``drafter.parameters()`` order) into the draft.

    Raises:
        ValueError: another number of tensors or other shapes (another draft)."""
    mine = list(getattr(drafter, "inner", drafter).parameters())
    if [tuple(p.shape) for p in mine] != [tuple(v.shape) for v in params]:
        raise ValueError("the snapshot's parameters do not match the draft's (another draft or draft kind?)")
    for p, v in zip(mine, params):
        p.copy_(torch.as_tensor(v).to(p.device, p.dtype))


def rounds_by_chunk(trace, chunk: int, domains: list[str], max_depth: int) -> dict:
    """tau and learner positions per chunk and per domain from one method's records.

    Args:
        trace: the method's `Trace` (``rounds.jsonl``); ``stream_index`` = stream prompt.
        chunk: prompts per chunk. domains: dataset of each stream prompt.
        max_depth: the draft's depth cap K (positions per round are min(n_t, K)).

    Returns:
        ``{"chunks": [{chunk, domains, rounds, tokens, tau, positions,
        positions_seen}], "per_domain": {domain: {rounds, tokens, tau, positions}}}``;
        ``positions`` counts rounds with a finite loss only (a frozen draft: 0),
        ``positions_seen`` is cumulative through the chunk.
    """
    chunks, per_domain, seen = [], {}, 0
    for c in range(math.ceil(len(domains) / chunk)):
        rows = [r for r in trace if c * chunk <= r.stream_index < (c + 1) * chunk]
        positions = sum(min(int(r.tokens_per_round), int(max_depth)) for r in rows if math.isfinite(r.loss))
        seen += positions
        tokens = sum(int(r.tokens_per_round) for r in rows)
        chunks.append({"chunk": c, "domains": list(dict.fromkeys(domains[c * chunk:(c + 1) * chunk])),
                       "rounds": len(rows), "tokens": tokens, "tau": tokens / len(rows) if rows else math.nan,
                       "positions": positions, "positions_seen": seen})
    for r in trace:
        row = per_domain.setdefault(domains[r.stream_index], {"rounds": 0, "tokens": 0, "positions": 0})
        row["rounds"] += 1
        row["tokens"] += int(r.tokens_per_round)
        row["positions"] += min(int(r.tokens_per_round), int(max_depth)) if math.isfinite(r.loss) else 0
    for row in per_domain.values():
        row["tau"] = row["tokens"] / row["rounds"]
    return {"chunks": chunks, "per_domain": per_domain}


def _stream_of(recording, prompts: int, chunk: int, every: int):
    """Recorded index and dataset of the stream's prompts and of up to one chunk of
    the (sub-)stream's prompts after them (the last chunk's held-out chunk)."""
    from specloop.realmodels.recording import recorded_items
    available = len(range(0, recording.num_prompts, int(every)))
    items = recorded_items(recording, min(available, int(prompts) + int(chunk)), every)
    return [i.index for i in items], [i.dataset for i in items]


def online_heldout(recording, results: str | Path, method: str, drafter, *, frozen: str | None = None,
                   every: int = 1, top_m: int | None = 32) -> dict:
    """The per-chunk held-out table of one online method (module docstring).

    Args:
        recording: the replayed `recording.Recording`.
        results: the stream's results folder (``<results>/<method>/rounds.jsonl`` and
            its ``chunk-NNN.pt`` snapshots).
        method: the online method (`stream.resolve_method`), e.g. "opt-hydra".
        drafter: the frozen draft the method started from (restored on return).
        frozen: the frozen method whose ``rounds.jsonl`` gives ``tau_frozen`` (None =
            none; a missing folder is ignored).
        every: the sub-stream step the stream replayed (`recorded_items`).
        top_m: recorded p_target tokens kept for ``ce_topm`` (None = all; default the
            online objective's 32, `OnlineConfig.top_m`).

    Returns:
        JSON-able dict: ``method``, ``frozen``, ``chunk``, ``prompts``, ``depths``,
        ``units``, ``chunks`` (per chunk c with a following chunk, served or only
        recorded: ``tau``,
        ``tau_frozen``, ``positions``, ``positions_seen``, ``domains``,
        ``heldout_chunk`` c+1, ``heldout_domains``, ``heldout_prompts``, ``heldout_served``,
        ``num_steps`` (learner steps by the end of c) and the
        `evaluate_draft` dicts ``frozen``, ``before``, ``after``), ``per_domain``
        (tau, tau_frozen, positions seen by the domain's last chunk).

    Raises:
        FileNotFoundError: no rounds.jsonl or a missing snapshot. ValueError: a
            frozen method, a snapshot of other prompts (another ``every``), or
            not a feature-head draft.
    """
    from specloop.realmodels.streams.runner import resolve_method
    from specloop.record import Trace
    spec = resolve_method(method)
    if spec.learner is None:
        raise ValueError(f"{spec.name} is a frozen method; name an online one (e.g. opt-{spec.drafter})")
    inner = _feature_drafter(drafter)
    folder = Path(results) / spec.name
    trace = Trace.load(folder / "rounds.jsonl")
    chunk, served = int(trace.meta["config"]["chunk"]), int(trace.meta["prompts"])
    indices, domains = _stream_of(recording, served, chunk, every)
    mine = rounds_by_chunk(trace, chunk, domains[:served], inner.max_depth)
    base = None
    if frozen is not None and (Path(results) / resolve_method(frozen).name / "rounds.jsonl").is_file():
        base = rounds_by_chunk(Trace.load(Path(results) / resolve_method(frozen).name / "rounds.jsonl"), chunk,
                               domains[:served], inner.max_depth)
    initial = [p.detach().clone() for p in inner.parameters()]
    rows = []
    try:
        for c in range(len(mine["chunks"])):
            if len(indices) <= (c + 1) * chunk:             # no prompt after the chunk, even in the recording
                break
            after = load_snapshot(folder, c)
            if list(after["recorded_indices"]) != indices[c * chunk:(c + 1) * chunk]:
                raise ValueError(f"snapshot {c} of {folder} covers recorded prompts {after['recorded_indices']}, "
                                 f"not {indices[c * chunk:(c + 1) * chunk]} (another --every?)")
            before = initial if c == 0 else load_snapshot(folder, c - 1)["params"]
            held = heldout_set(recording, indices[(c + 1) * chunk:(c + 2) * chunk], inner.max_depth, top_m)
            evals = {}
            for name, params in (("frozen", initial), ("before", before), ("after", after["params"])):
                apply_snapshot(inner, params)
                evals[name] = evaluate_draft(inner, held)
            info = mine["chunks"][c]
            rows.append({**info, "tau_frozen": None if base is None else base["chunks"][c]["tau"],
                         "num_steps": int(after["num_steps"]), "heldout_chunk": c + 1,
                         "heldout_domains": list(dict.fromkeys(domains[(c + 1) * chunk:(c + 2) * chunk])),
                         "heldout_prompts": list(held.stream_indices),
                         "heldout_served": (c + 1) * chunk < served, **evals})
    finally:
        apply_snapshot(inner, initial)
    per_domain = {}
    for d, row in mine["per_domain"].items():
        last = max(c["chunk"] for c in mine["chunks"] if d in c["domains"])
        per_domain[d] = {"tau": row["tau"], "tau_frozen": None if base is None else base["per_domain"][d]["tau"],
                         "positions": row["positions"], "last_chunk": last,
                         "positions_seen": mine["chunks"][last]["positions_seen"]}
    return {"method": spec.name, "frozen": frozen, "recording": str(recording.folder), "chunk": chunk,
            "prompts": served, "every": int(every), "depths": sorted(int(d) for d in range(1, inner.max_depth + 1)),
            "units": {"ce_greedy": "nats/token vs the greedy next token (in-vocabulary anchors)",
                      "ce_topm": f"nats/token vs the recorded top-{top_m or 'm'} p_target (draft vocabulary, "
                                 "renormalised)", "top1": "fraction", "tau": "tokens per round",
                      "positions_seen": "verified positions handed to the learner, cumulative"},
            "chunks": rows, "per_domain": per_domain}


def prompt_split(split, recording, stream_indices):
    """A `recording_data.RecordingSplit` of the label positions of the given prompts
    only (whatever their train / held-out side): ``split``'s shards (opened by
    `recording_data.open_recording_splits` on ``recording`` alone) with every other
    prompt unlabelled.

    Raises:
        ValueError: no label position left."""
    from specloop.realmodels.training.recording_data import RecordingSplit
    wanted = {int(i) for i in stream_indices}
    shards = []
    for entry, shard in zip(recording.manifest["shards"], split.shards):
        mask = np.zeros(shard.labelled.size, dtype=bool)
        for k, (a, b) in enumerate(zip(shard.starts, shard.stops)):
            mask[a:b] = int(entry["first_index"]) + k in wanted
        shards.append(replace(shard, labelled=shard.labelled & mask, is_val=np.zeros_like(shard.is_val)))
    return RecordingSplit(shards, "train", split.layers, split.soft_targets, split.top_m)


def _trainer(inner):
    """(kind, heads, train function, loss config class) of a feature-head draft."""
    from specloop.realmodels.heads.head_drafting import HydraDrafter
    if isinstance(inner, HydraDrafter):
        from specloop.realmodels.training.train_hydra import HydraTrainConfig, train_hydra_heads
        return "hydra", inner.heads, train_hydra_heads, HydraTrainConfig
    from specloop.realmodels.training.train_medusa import MedusaTrainConfig, train_medusa_heads
    return "medusa", inner.heads, train_medusa_heads, MedusaTrainConfig


def offline_rows(table: dict, recording, target_model, drafter, *, epochs: int = 3, batch_size: int = 64,
                 lr: float = 3e-4, max_seconds: float = 60.0, soft_targets: bool = True, top_m: int | None = 32,
                 seed: int = 0) -> list[dict]:
    """The in-domain offline reference of an `online_heldout` table.

    For each domain whose last chunk e has a following chunk: the frozen draft is
    trained (the ``draft train --from-recording`` loop, `head_loop.run_loop` with AdamW,
    warm-up then cosine decay) on the recorded continuation positions of the stream
    prompts served through chunk e -- the positions the online learner had been handed
    -- for about ``epochs`` passes (steps = ceil(epochs x positions / batch_size)) or
    ``max_seconds``, whichever ends first, then evaluated (`evaluate_draft`) on chunk
    e+1 like the online rows. The draft's parameters are restored afterwards.

    Args:
        table: `online_heldout` output. recording: the `Recording` it was built from.
        target_model: the target (transformers causal LM; `recording_data.check_recording`).
        drafter: the frozen feature-head draft. soft_targets: train on the recorded
            top-m (the online objective's target) instead of the greedy token.

    Returns:
        Rows of ``domain``, ``through_chunk`` e, ``heldout_chunk``, ``train_prompts``,
        ``train_positions`` (label positions of the training prompts),
        ``online_positions_seen``, ``steps``, ``train_seconds`` and the
        `evaluate_draft` dicts ``offline``, ``online_after`` and ``frozen`` (the
        latter two copied from the table's row e).

    Raises:
        ValueError: epochs, batch_size or max_seconds not positive; a recording the
            draft cannot train on.
    """
    from specloop.realmodels.recording import recorded_items
    from specloop.realmodels.training.head_loop import LoopConfig
    from specloop.realmodels.training.recording_data import open_recording_splits
    if int(epochs) < 1 or int(batch_size) < 1 or not max_seconds > 0:
        raise ValueError(f"epochs, batch_size and max_seconds must be positive, got {epochs}, {batch_size}, "
                         f"{max_seconds}")
    inner = _feature_drafter(drafter)
    kind, heads, train, loss_config = _trainer(inner)
    split, _, _ = open_recording_splits(recording.folder, recording.settings["target"], target_model, kind,
                                        soft_targets=soft_targets)
    rows_by_chunk = {r["chunk"]: r for r in table["chunks"]}
    indices = [i.index for i in recorded_items(recording, table["prompts"], table["every"])]   # served prompts
    chunk, initial = table["chunk"], [p.detach().clone() for p in inner.parameters()]
    flags = [p.requires_grad for p in heads.parameters()]
    out = []
    try:
        for domain, info in table["per_domain"].items():
            e = info["last_chunk"]
            if e not in rows_by_chunk:
                continue
            apply_snapshot(inner, initial)
            data = prompt_split(split, recording, indices[:(e + 1) * chunk])
            held_prompts = rows_by_chunk[e]["heldout_prompts"]
            steps = max(1, math.ceil(int(epochs) * data.positions / int(batch_size)))
            loop = LoopConfig(steps=steps, batch_size=int(batch_size), lr=float(lr), warmup=max(1, steps // 10),
                              max_seconds=float(max_seconds), seed=int(seed))
            for p in heads.parameters():           # a loaded draft may come with gradients off
                p.requires_grad_(True)
            with torch.inference_mode(False), torch.enable_grad():
                report = train(heads, data, prompt_split(split, recording, held_prompts), loop,
                               loss_config(eval_positions=256), progress=False)
            row = rows_by_chunk[e]
            out.append({"domain": domain, "through_chunk": e, "heldout_chunk": e + 1,
                        "train_prompts": min(len(indices), (e + 1) * chunk), "train_positions": data.positions,
                        "online_positions_seen": row["positions_seen"], "steps": int(report["steps"]),
                        "train_seconds": float(report["seconds"]),
                        "offline": evaluate_draft(inner, heldout_set(recording, held_prompts, inner.max_depth, top_m)),
                        "online_after": row["after"], "frozen": row["frozen"]})
    finally:
        apply_snapshot(inner, initial)
        for p, flag in zip(heads.parameters(), flags):
            p.requires_grad_(flag)
        heads.eval()
    return out
