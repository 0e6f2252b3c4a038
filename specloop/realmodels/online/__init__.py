"""Online draft adaptation inside the real decoder (OnlineSpec Algorithm 1: draft ->
verify -> feedback -> *update*; Sec. 3 learners, Sec. 4 / App. B set-up).

`OnlineDrafter` wraps any trained `Drafter` and is itself a `Drafter`, so the
unchanged `SpeculativeDecoder` drives it. In ``observe`` it turns the round's
`VerifyFeedback` into a training sample *before* the inner drafter moves on, keeps
it in a replay buffer, and -- depending on the mode -- updates the draft's
parameters through an online learner of `specloop.strategies` (OGD, optimistic OGD,
Hedge ensemble, optimism + ensemble, OSD distillation, optionally inside the RMS
`Preconditioned` wrapper; all ``step(params, grads, loss, oracle) -> params`` on lists
of torch tensors; names from `specloop.strategies.registry`):

* ``mode="round"``: every ``update_every`` rounds one micro-update on a mini-batch
  of ``batch_size`` samples: the newest one plus uniformly drawn older ones from the
  replay buffer (capacity ``buffer_size``);
* ``mode="chunk"``: the paper's chunked mode (App. B.1): samples of a chunk of
  prompts are collected, and `end_chunk` runs ``epochs`` passes over them in
  shuffled mini-batches (one learner step per mini-batch).

``background=True`` runs the updates on a worker thread (App. B.2) so decoding does
not wait. The worker trains a private copy of the draft's parameters (`workspace`) and
never writes what the decoder reads; every ``publish_every`` learner steps it stages the
trained values, and the decoder copies them into the draft between rounds (under the
drafting lock), so each round drafts with one set of weights throughout.

Loss f_t(w) (`FeatureHeadObjective`): at every verified position j of the round
(the pending token and each accepted node; row j of ``VerifyFeedback.target_logits``)
the cross-entropy ``-sum_x p_target_j(x) log q_draft_j(x; w)`` of the draft head of
depth j against the target's temperature-1 distribution, truncated to its top
``top_m`` tokens, restricted to the draft's reduced vocabulary and renormalised there
(the draft cannot place mass outside its vocabulary; FR-Spec / EAGLE-3 train the same
way; `samples.sparse_targets` says why truncation comes first). Equal to KL(p || q) up to the entropy of p, which does not depend on w.
Heads are unrolled teacher-forced on the committed tokens (Hydra's sequential
dependence uses the heads' own features).

EAGLE / EAGLE-3 heads (`EagleObjective`) are re-run with gradients over a window of
the true target features (training-time test, steps 1..2) at the verified positions.
The distilled small-LM draft (Vanilla SD / OSD rows; `SmallLMObjective`) uses the
same cross-entropy, re-running the draft with gradients over the last ``window``
context tokens and the accepted tokens. Other drafters (n-gram, separate small
models with another tokenizer) have no objective: their online methods fail with a
ValueError saying so.

Default step sizes (`DEFAULT_LR`) come from a probe on SmolLM2-135M's Hydra heads:
plain OGD at 0.05 diverged (NaN draft logits), 1e-3..3e-3 lowered the in-stream
loss fastest without raising the loss on later prompts.

OSD (Liu et al. 2024) distils only on rounds with a rejection: the learner declares
it (``feedback == "rejections"``, `specloop.strategies.registry`) and the adapter hands
it each new rejected sample once, as an oracle through ``add_feedback``.

Per-round loss: `OnlineAdapter.record` returns f_t(w_t), the round's own
cross-entropy at the parameters that drafted it, for every learner and mode;
`OnlineDrafter.round_losses` keeps them and the stream runner writes them into
`RoundRecord.loss`. The objectives read the drafters only through their public
online-training accessors (``target_to_draft``; ``feature_state`` /
``unrolled_logits`` of the feature heads, ``ttt_hidden`` / ``draft_logits`` of EAGLE, ``context_logits``
of the small LM).

Modules, one job each: `samples` (one round's training sample), `objectives` (the
losses f_t), `learners` (the learner factory and default step sizes), `config`
(`OnlineConfig`), `functional` (losses and gradients at other parameter values, one
point or several stacked), `workspace` (where the learner evaluates: the draft's
parameters or the background worker's copy), `adapter` (`OnlineAdapter`: replay
buffer, schedule, background worker and publication, checkpoint state), `drafter`
(`OnlineDrafter`), `checkpoint` (files).
"""
from __future__ import annotations

from specloop.realmodels.online.adapter import OnlineAdapter
from specloop.realmodels.online.checkpoint import load_checkpoint, save_checkpoint
from specloop.realmodels.online.config import OnlineConfig
from specloop.realmodels.online.drafter import OnlineDrafter
from specloop.realmodels.online.learners import DEFAULT_LR, LEARNER_KINDS, PRECONDITIONERS, head_learner
from specloop.realmodels.online.objectives import (EagleObjective, FeatureHeadObjective, SmallLMObjective,
                                                   objective_for)
from specloop.realmodels.online.samples import ContextSample, EagleSample, FeatureSample, sample_from_dict

__all__ = ["FeatureSample", "ContextSample", "FeatureHeadObjective", "SmallLMObjective", "EagleObjective",
           "EagleSample", "objective_for", "OnlineConfig", "OnlineAdapter", "OnlineDrafter", "head_learner",
           "LEARNER_KINDS", "PRECONDITIONERS", "DEFAULT_LR", "save_checkpoint", "load_checkpoint",
           "sample_from_dict"]
