"""Lookahead Reasoning (Fu et al. 2025) and Online-LR (OnlineSpec Sec. 3.1, Eq. 2,
Table 2, App. B.10): step-level speculation with a judge and a DPO-updated draft.

Modules: `steps` (segmentation), `expansion` (batched greedy step generation),
`lockstep` (several prompts' generations served together), `judge` (model / cheap
judges), `lookahead` (LR decoding), `dpo` (Online-LR and
OSD-LR updates), `runner` (the resumable task-stream runner), `tasks` (prompts and
scoring), `_humaneval_worker` (the subprocess that scores one HumanEval completion).
"""
