"""Prompts for the real-model half, from installed dataset packages (no downloads).

Modules:

* `prompts`  -- real prompts (HumanEval, MT-bench, IFBench, ShareGPT and its code /
  writing / chat topics) with their held-out / warm-up splits.
* `prompt_files` -- a researcher's own prompts (JSONL / JSON / CSV / Parquet files,
  datasets in the local Hugging Face cache) wherever a dataset name goes.
* `streams`  -- prompt streams for online draft adaptation (domain-shift and
  interleaved orders).
* `arith`    -- a seeded stream of GSM8K-like arithmetic word problems with exact answers.
* `gsm8k`    -- GSM8K test questions with their answers, from the GSM-Symbolic templates package.
"""
