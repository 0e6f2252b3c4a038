"""`OnlineAdapter`: the objective, the learner, the replay buffer, the update schedule
(round / chunk), the background worker (OnlineSpec App. B.2) and the checkpoint state of
online adaptation in the real decoder (`specloop.realmodels.online`)."""
from __future__ import annotations

import math
import queue
import threading
import time
from typing import Any, Callable

import numpy as np
import torch

from specloop.realmodels.online.config import OnlineConfig
from specloop.realmodels.online.functional import ParameterOwner
from specloop.realmodels.online.learners import head_learner
from specloop.realmodels.online.objectives import objective_for
from specloop.realmodels.online.samples import FeatureSample, sample_from_dict
from specloop.realmodels.online.workspace import Workspace, shadow_workspace
from specloop.strategies import _arrays as A
from specloop.strategies.precondition import Preconditioned
from specloop.strategies.registry import (learner_feedback, learns_from_round, resolve_learner,
                                         uses_played_gradient)

__all__ = ["OnlineAdapter"]


class OnlineAdapter:
    """Owns the objective, the learner, the replay buffer and the update schedule.

    Args:
        drafter: the inner drafter (its ``parameters()`` are updated in place); a
            composite drafter with a ``trainable`` attribute (`heads.hybrid.HybridDrafter`)
            has that part trained.
        config: `OnlineConfig`.

    Attributes:
        train_seconds: wall seconds spent in updates (foreground and background).
        train_cpu_seconds: CPU seconds of the threads that ran the updates, in them
            (`time.thread_time`; the worker's own in background mode).
        publications: background mode: trained weights copied into the drafter.
        num_steps: learner steps taken.
        last_loss: the mini-batch loss of the latest learner step (NaN before any, and
            for learners that ignore the played point, OSD, whose steps do not evaluate it).
        pending_feedback: samples handed to a "rejections" learner (OSD) through
            ``add_feedback`` and not yet distilled (checkpointed; their oracles are
            rebuilt on load).

    How a learner learns is its own declaration (``feedback``,
    `specloop.strategies.registry`): a "played" learner gets the mini-batch gradient at
    the played point and an oracle for other points every step; a "rejections" learner
    (OSD) gets no gradient, and every new sample with a rejected draft token once,
    as an oracle through ``add_feedback``. RMS preconditioning is the learner's too
    (`specloop.strategies.precondition.Preconditioned`, ``precondition="rms"``).
    """

    def __init__(self, drafter, config: OnlineConfig) -> None:
        self.drafter = drafter
        self.config = config
        # a composite drafter (a lookup + head hybrid) names the part it trains
        trained = getattr(drafter, "trainable", drafter)
        self.objective = objective_for(trained, top_m=config.top_m)
        self.params = [p for p in trained.parameters()]
        if not self.params:
            raise ValueError(f"drafter {getattr(drafter, 'name', '?')!r} has no trainable parameters")
        self.learner = head_learner(config.learner, config.step_size, num_learners=config.num_learners,
                                    meta_lr=config.meta_lr, seed=config.seed,
                                    osd_update_every=config.osd_interval if config.mode == "round" else 1,
                                    precondition=config.precondition, rms_decay=config.rms_decay,
                                    ensemble_losses=config.ensemble_losses)
        # evaluates losses at other parameter values without writing them into the
        # drafter (None: no single module holds the parameters; values are written in)
        self.owner = ParameterOwner.find(trained, self.params)
        if config.stacked_oracle and self.owner is None:
            raise ValueError(f"stacked_oracle needs the drafter's parameters in one module; "
                             f"{getattr(drafter, 'name', type(drafter).__name__)!r} has none")
        self.rng = np.random.default_rng(config.seed)
        self.buffer: list[FeatureSample] = []
        self.chunk_samples: list[FeatureSample] = []
        self.pending_feedback: list[FeatureSample] = []
        self.rounds = 0
        self.num_steps = 0
        self.train_seconds = 0.0
        self.train_cpu_seconds = 0.0
        self.last_loss = math.nan
        self.lock = threading.RLock()
        self._queue: queue.Queue | None = None
        self._worker: threading.Thread | None = None
        self._error: BaseException | None = None
        self._played_losses: tuple[Any, float] | None = None   # (first sample, its loss) at the played point
        # where the learner evaluates: the drafter's own parameters, or in background
        # mode a private copy the worker trains while the decoder drafts (published
        # into the drafter between rounds, every ``publish_every`` steps)
        self.live = Workspace(self.objective, self.params, self.owner)
        self.train = shadow_workspace(trained, self.live, config.top_m) if config.background else self.live
        self.publications = 0
        self._staging = threading.Lock()
        self._staged: list[torch.Tensor] | None = None
        self._since_publish = 0

    @property
    def learns_played(self) -> bool:
        """Whether the learner learns from the played point's gradient (its declared
        ``feedback`` is "played"), rather than from handed-over rejections (OSD)."""
        return learner_feedback(self.learner) == "played"

    @property
    def rms(self) -> list[torch.Tensor] | None:
        """The RMS preconditioner's running second moment v (like the parameters), or
        None ("none", or before its first played gradient)."""
        v = getattr(self.learner, "second_moment", None)
        return None if v is None else A.from_numpy_or_same(v, self.params)

    @property
    def rms_steps(self) -> int:
        """Played gradients folded into the RMS preconditioner (0 under "none")."""
        return int(getattr(self.learner, "steps", 0)) if isinstance(self.learner, Preconditioned) else 0

    # -- loss / gradient ---------------------------------------------------------
    # the learner's evaluations run on `self.train` (the drafter's parameters, or in
    # background mode a private copy: `workspace.shadow_workspace`)
    def _loss_grad(self, samples: list[FeatureSample]) -> tuple[float, list[torch.Tensor]]:
        return self.train.loss_grad(samples)

    def sample_loss(self, sample) -> float:
        """f_t(w) of one round's sample at the drafter's current parameters (those that
        drafted the round): its mean cross-entropy over the verified positions (no
        gradient; under the drafting lock). NaN for None."""
        with self.lock:
            return self.live.loss(sample)

    def _loss_grad_at(self, values: list[torch.Tensor], samples: list[FeatureSample]):
        """f and grad f at other parameter values (the learners' oracle), on the
        training workspace: substituted for the call (`ParameterOwner`), or, for a
        drafter without one parameter module, written in and restored."""
        return self.train.loss_grad_at(values, samples)

    def _oracle(self, samples: list[FeatureSample]) -> Callable:
        """The learners' oracle on ``samples``: ``oracle(values) -> (loss, grads)``, and
        with ``stacked_oracle`` also ``oracle.many(points)`` (one vmapped call for an
        ensemble's base learners, `ParameterOwner.loss_grad_many`)."""
        batch, train = list(samples), self.train

        def oracle(values):
            return train.loss_grad_at(values, batch)
        if self.config.stacked_oracle:
            oracle.many = lambda points: train.owner.loss_grad_many(train.objective, points, batch)
        return oracle

    def _write(self, values: list[torch.Tensor]) -> None:
        """Copy ``values`` into the drafter's parameters."""
        self.live.write(values)

    def _step(self, samples: list[FeatureSample]) -> None:
        """One learner step on ``samples``: evaluated on the training workspace, the new
        parameters written into the drafter (under the drafting lock), or in background
        mode into the private copy and published every ``publish_every`` steps. See the
        class docstring for what each learner kind is given."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        train = self.train
        played = [p.detach().clone() for p in train.params]
        if self.learns_played:
            needs_grad = uses_played_gradient(self.learner)
            loss, grads = train.loss_grad(samples) if needs_grad else train.loss_only(samples)
            self._played_losses = train.sample_losses   # at w_t (oracle calls below evaluate elsewhere)
            new = self.learner.step(played, grads, loss, oracle=self._oracle(samples))
        else:                              # the learner ignores the played point's gradient: skip it
            loss, grads = math.nan, [torch.zeros_like(p) for p in train.params]
            new = self._feedback_step(played, grads, loss, samples)
        if not all(A.all_finite(torch.as_tensor(v)) for v in new):
            raise ValueError(f"online update produced non-finite draft parameters (learner "
                             f"{self.config.learner!r}, lr {self.config.step_size}); lower the learning rate")
        if train is self.live:
            with self.lock:
                self._write(new)
        else:
            train.write(new)
            self._since_publish += 1
            if self._since_publish >= self.config.publish_every:
                self._stage()
        self.last_loss = loss
        self.num_steps += 1
        self.train_seconds += time.perf_counter() - t0
        self.train_cpu_seconds += time.thread_time() - cpu0

    # -- publication (background mode) ----------------------------------------------
    def _stage(self) -> None:
        """Worker side: hand a copy of the trained values over for the next round."""
        values = [p.detach().clone() for p in self.train.params]
        with self._staging:
            self._staged = values
        self._since_publish = 0

    def publish(self) -> bool:
        """Decoder side, between rounds: copy the latest staged values into the drafter
        (under the drafting lock). Returns whether anything was published."""
        with self._staging:
            values, self._staged = self._staged, None
        if values is None:
            return False
        with self.lock:
            self._write(values)
        self.publications += 1
        return True

    def _feedback_step(self, played, grads, loss, samples: list[FeatureSample]):
        """A "rejections" learner (OSD): hand it one oracle per new sample it learns
        from (`learns_from_round`: those with a rejection; round mode: the newest sample
        only, replayed ones were handed over already), then one ``step``, in which it
        distils when due (its ``update_every``). Samples it has distilled leave
        `pending_feedback`."""
        fresh = samples[:1] if self.config.mode == "round" else samples
        for s in fresh:
            if learns_from_round(self.learner, s.rejected):
                self.pending_feedback.append(s)
                self.learner.add_feedback(oracle=self._sample_oracle(s))
        new = self.learner.step(played, grads, loss, oracle=None)
        keep = int(self.learner.buffered)
        self.pending_feedback = self.pending_feedback[-keep:] if keep else []
        return new

    # -- schedule -------------------------------------------------------------------
    def record(self, sample: FeatureSample | None) -> float:
        """Add a round's sample and run a micro-update when one is due.

        Returns:
            f_t(w_t): the round's own loss (`sample_loss`) at the parameters that
            drafted the round, before any update this call makes (``background``:
            the drafter's parameters change only when this call publishes, after the
            loss is taken). A foreground gradient step on a
            mini-batch headed by the sample yields it from the same forward pass;
            otherwise (chunk mode, OSD-style learners, background, no update due) it costs one
            forward pass without gradient, inside the round's ``update_time``.
            NaN when the round gave no sample.
        """
        self.rounds += 1
        try:
            return self._record(sample)
        finally:
            if self.train is not self.live:
                self.publish()           # between rounds: the next round drafts with the newest weights

    def _record(self, sample: FeatureSample | None) -> float:
        if sample is None:
            return math.nan
        self.buffer.append(sample)
        if len(self.buffer) > self.config.buffer_size:
            del self.buffer[0]
        if self.config.mode == "chunk":
            self.chunk_samples.append(sample)
            return self.sample_loss(sample)
        if self.rounds % self.config.update_every != 0:
            return self.sample_loss(sample)
        if self.config.background or not self.learns_played:
            loss = self.sample_loss(sample)             # before the update can move w
            self._submit(self._replay_batch())
            return loss
        self._played_losses = None
        self._submit(self._replay_batch())              # foreground: newest sample first
        got = self._played_losses
        return got[1] if got is not None and got[0] is sample else self.sample_loss(sample)

    def _replay_batch(self) -> list[FeatureSample]:
        newest = self.buffer[-1]
        older = self.buffer[:-1]
        extra = min(self.config.batch_size - 1, len(older))
        picks = self.rng.choice(len(older), size=extra, replace=False) if extra else []
        return [newest] + [older[int(i)] for i in picks]

    def end_chunk(self) -> float:
        """Chunk mode: ``epochs`` shuffled passes over the chunk's samples. Waits for
        background updates. Returns the seconds this call took."""
        t0 = time.perf_counter()
        if self.config.mode == "chunk" and self.chunk_samples:
            samples, self.chunk_samples = self.chunk_samples, []
            bs = self.config.batch_size
            for _ in range(self.config.epochs):
                order = self.rng.permutation(len(samples))
                for start in range(0, len(samples), bs):
                    self._submit([samples[int(i)] for i in order[start:start + bs]])
        self.wait()
        return time.perf_counter() - t0

    # -- background worker (App. B.2) ------------------------------------------------
    def _submit(self, batch: list[FeatureSample]) -> None:
        if not self.config.background:
            self._step(batch)
            return
        if self._worker is None:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._work, name="specloop-online-update", daemon=True)
            self._worker.start()
        self._queue.put(batch)

    def _work(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    self._step(batch)
            except BaseException as exc:  # surfaced by wait()
                self._error = exc
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        """Block until queued background updates are done; re-raise a worker error."""
        if self._queue is not None:
            self._queue.join()
        if self.train is not self.live and self._since_publish:
            self._stage()                # the steps since the last publication
        if self.train is not self.live:
            self.publish()
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"background draft update failed: {error}") from error

    def close(self) -> None:
        """Finish queued updates and stop the worker thread."""
        if self._worker is not None:
            self.wait()
            self._queue.put(None)
            self._worker.join()
            self._worker, self._queue = None, None

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly: parameters, learner state, replay
        buffer, pending chunk samples and OSD feedback, generator, counters (the RMS
        preconditioner's state is the learner's). Waits for background updates first."""
        self.wait()
        return {"params": [p.detach().cpu().clone() for p in self.params],
                "learner": self.learner.state_dict(),
                "buffer": [s.to_dict() for s in self.buffer],
                "chunk_samples": [s.to_dict() for s in self.chunk_samples],
                "osd_pending": [s.to_dict() for s in self.pending_feedback],
                "rng": self.rng.bit_generator.state, "rounds": self.rounds, "num_steps": self.num_steps,
                "train_seconds": self.train_seconds, "config": dict(self.config.__dict__)}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict` output.

        Checkpoints written before the learner registry (learner aliases such as "opt",
        the RMS second moment beside the learner's state) load too.

        Raises:
            ValueError: parameters of other shapes, or a different learner kind.
        """
        if resolve_learner(state["config"]["learner"]) != self.config.learner:
            raise ValueError(f"checkpoint is for learner {state['config']['learner']!r}, not {self.config.learner!r}")
        shapes = [tuple(p.shape) for p in self.params]
        if [tuple(t.shape) for t in state["params"]] != shapes:
            raise ValueError("checkpoint parameters do not match the drafter's parameter shapes")
        self._write(state["params"])
        if self.train is not self.live:
            self.train.write(state["params"])
        self.learner.load_state_dict(_learner_state(state, self.learner))
        self.buffer = [sample_from_dict(d) for d in state["buffer"]]
        self.chunk_samples = [sample_from_dict(d) for d in state["chunk_samples"]]
        self.pending_feedback = [sample_from_dict(d) for d in state["osd_pending"]]
        for s in self.pending_feedback:    # buffered oracle closures are not saved: rebuild them
            self.learner.add_feedback(oracle=self._sample_oracle(s))
        self.rng.bit_generator.state = state["rng"]
        self.rounds, self.num_steps = int(state["rounds"]), int(state["num_steps"])
        self.train_seconds = float(state["train_seconds"])

    def _sample_oracle(self, sample: FeatureSample) -> Callable:
        return lambda values, s=sample: self._loss_grad_at(values, [s])




def _learner_state(state: dict, learner) -> dict:
    """The learner's part of an adapter checkpoint. Checkpoints from before the
    `Preconditioned` wrapper kept the RMS second moment beside the inner learner's state
    ("rms", "rms_steps"): wrap them into the wrapper's state."""
    inner = state["learner"]
    if not isinstance(learner, Preconditioned) or inner.get("class") == type(learner).__name__:
        return inner
    rms = state.get("rms")
    return {"class": type(learner).__name__, "inner": inner, "decay": learner.decay, "eps": learner.eps,
            "steps": int(state.get("rms_steps", 0)),
            "second_moment": None if rms is None else A.to_numpy_list(rms)}
