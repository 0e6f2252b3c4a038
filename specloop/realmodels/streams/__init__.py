"""Serving prompt streams with the real decoder: frozen and online drafts, the
recording of a stream's target side, its exact replay, and the comparisons.

Modules (import the one you need):

* `runner`          -- `StreamRunner`: a stream's methods (frozen, online, greedy baseline), resumable.
* `results`         -- the ``stream`` command's summary, paired against the frozen draft.
* `compare`         -- per-prompt rounds and tokens of a method (the inputs of `specloop.stats.paired_gain`).
* `record`          -- the recorder: batched greedy generation into a recording (`record_stream`).
* `replay`          -- `ReplayDecoder`: a draft replayed against a recording, verification priced.
* `replay_check`    -- a replay compared round for round with the real decoder.
* `scale`           -- the online-at-scale grid (jobs, workers, resumable).
* `scale_results`   -- the grid's tables and verdicts.
* `online_heldout`  -- held-out loss of the chunk snapshots an online run kept.
* `live_wallclock`  -- the live decoder's wall-clock rows (frozen, serial, background), interleaved per chunk.

The recording's format and readers are `specloop.realmodels.recording`.
"""
