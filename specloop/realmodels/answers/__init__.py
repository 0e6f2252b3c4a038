"""The target's side as compact, committed inputs: answer sets.

Modules:

* `generator` — continuously batched greedy generation (slot KV cache, length-ordered
  queue); float32 equals batch-1 greedy decoding.
* `answer_set` — the folder format (token ids only, pieces with sha256), reading and
  verification, target / tokenizer fingerprints.
* `run` — generation in resumable pieces with a time budget.
* `rebuild` — a stream recording rebuilt from an answer set by teacher-forced prefill.
"""
