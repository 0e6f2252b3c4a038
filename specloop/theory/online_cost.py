"""When do online draft updates pay in wall-clock? A cost model of the three placements.

A round of speculative decoding costs ``v`` seconds of verification and ``d`` of
drafting and commits tau tokens; a frozen draft gives tau_f / (v + d) tokens/s. An
online draft raises tau to tau_f (1 + g(m)), where g(m) is the relative tau gain when
the learner updates every m rounds (measured: the gain decays as updates grow rare,
because much of it adapts to the current response), and pays for it with ``u``
seconds of learner work per update (sample collection and the gradient step). The
speedup of online over frozen (tokens/s ratio, same prompts) in each placement:

* **Serial** (updates on the decoding cores; decoding waits): a round costs
  v + d + u / m, so

      S_serial(m) = (1 + g(m)) (v + d) / (v + d + u / m),

  which pays iff g(m) > u / (m (v + d)) (`serial_break_even_gain`).

* **Background on shared cores, skipping** (a worker thread updates while the decoder
  drafts and verifies, the cores split between them, and takes the newest round's
  update whenever it is free, dropping those it missed): the decoder's round slows by a factor
  sigma >= 1 (fewer threads, contention for memory bandwidth; measure it as the
  round time with the worker busy over the round time alone on all cores), and the
  worker, taking ``u_bg`` seconds an update on its own threads, lands an update every
  m_bg = max(1, u_bg / (sigma (v + d))) rounds, so

      S_bg = (1 + g(m_bg)) / sigma,

  which pays iff g(m_bg) > sigma - 1 (`background_break_even_gain`).

* **Background with a queue** (what `realmodels.online.OnlineAdapter` does: every
  round queues its update for the worker, none is skipped, and the decoder waits for
  the backlog at each chunk end): over a chunk of R rounds the decoder spends
  R sigma (v + d) and the worker R u_bg, so the chunk takes the larger of the two
  (the worker's lag behind the last round is one update, negligible for large R):

      S_queue = (1 + g) (v + d) / max(sigma (v + d), u_bg),

  g being the gain of updates every round applied late (at most the backlog). When
  u_bg > sigma (v + d) the decoder idles at chunk ends and the speedup falls as
  (v + d) / u_bg; it pays iff g > max(sigma, u_bg / (v + d)) - 1
  (`queued_break_even_gain`).

* **Separate device** (the learner on its own accelerator, as Aurora and TIDE train):
  decoding keeps its speed except for installing published weights, ``publish`` seconds
  once every ``publish_every`` updates; updates land every m_dev = max(1, u_dev / (v + d))
  rounds, so

      S_dev = (1 + g(m_dev)) (v + d) / (v + d + publish / (publish_every m_dev)).

Derivation: in each placement tokens/s is tokens per round over seconds per round;
the frozen draft's round is v + d (measured at all cores); the online draft's tokens
per round are tau_f (1 + g(m)) at the update interval m that placement realises; the
ratio cancels tau_f. Update intervals below one round cannot occur (the learner then
idles), hence the max(1, .). The model assumes the gain depends on the update interval
alone (not on the staleness of a background update beyond it) and that v, d and u are
constant over the stream; both are checked by comparing its predictions with rows
measured on the live decoder.

Inputs and units: seconds (per round or per update), intervals in rounds; every
function is pure and takes floats. Source: this project's measurement question (no
paper reports the update share of wall time on shared hardware; OSD, Liu et al. 2024,
argues the updates fit in spare compute; OnlineSpec's tokens/s leave training out).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["GainCurve", "serial_speedup", "serial_break_even_gain", "background_update_interval",
           "background_speedup", "background_break_even_gain", "queued_background_speedup",
           "queued_break_even_gain", "separate_device_speedup", "placement_speedups", "implied_update_share"]


def _positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return value


def _round(verify_seconds: float, draft_seconds: float, update_seconds: float) -> tuple[float, float]:
    """Validated (v + d, u): v > 0, d >= 0, u >= 0 seconds."""
    v = _positive("verify_seconds", verify_seconds)
    d = _positive("draft_seconds", draft_seconds, allow_zero=True)
    return v + d, _positive("update_seconds", update_seconds, allow_zero=True)


def _slowdown(slowdown: float) -> float:
    """Validated sigma >= 1."""
    sigma = _positive("slowdown", slowdown)
    if sigma < 1:
        raise ValueError(f"slowdown must be >= 1 (decoding alone on all cores is the reference), got {slowdown}")
    return sigma


@dataclass(frozen=True)
class GainCurve:
    """The relative tau gain g(m) of online over frozen against the update interval m.

    Built from measured points (interval in rounds, gain as a fraction, e.g. 0.112 for
    +11.2 %); interpolated linearly in log2 m between them, constant (the first
    point's gain) below the smallest interval, and beyond the largest continued along
    the last segment's slope in log2 m but never below 0 (rarer updates do not turn a
    gain into a loss in this model; a single point is a constant curve).

    Raises:
        ValueError: no points, an interval < 1, repeated intervals, or a non-finite gain.
    """

    intervals: tuple[float, ...]
    gains: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Sequence[tuple[float, float]]) -> "GainCurve":
        if not points:
            raise ValueError("a gain curve needs at least one (interval, gain) point")
        pts = sorted((float(m), float(g)) for m, g in points)
        if any(m < 1 or not math.isfinite(m) for m, _ in pts):
            raise ValueError(f"update intervals must be finite and >= 1 round, got {[m for m, _ in pts]}")
        if len({m for m, _ in pts}) != len(pts):
            raise ValueError(f"update intervals repeat in {[m for m, _ in pts]}")
        if any(not math.isfinite(g) for _, g in pts):
            raise ValueError("gains must be finite")
        return cls(tuple(m for m, _ in pts), tuple(g for _, g in pts))

    def __call__(self, interval: float) -> float:
        """g(m) at update interval ``interval`` (rounds, >= 1)."""
        m = float(interval)
        if not m >= 1:
            raise ValueError(f"update interval must be >= 1 round, got {interval}")
        xs, ys = [math.log2(v) for v in self.intervals], self.gains
        x = math.log2(m)
        if len(xs) == 1 or x <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return max(0.0, ys[-1] + slope * (x - xs[-1]))


def serial_speedup(verify_seconds: float, draft_seconds: float, update_seconds: float, gain: float,
                   update_every: float = 1.0) -> float:
    """S_serial = (1 + g) (v + d) / (v + d + u / m): online over frozen tokens/s, serial updates.

    Args:
        verify_seconds, draft_seconds: v and d, seconds per round (> 0 and >= 0).
        update_seconds: u, seconds per update (>= 0). gain: g at this interval (> -1).
        update_every: m, rounds per update (>= 1).
    """
    vd, u = _round(verify_seconds, draft_seconds, update_seconds)
    m = float(update_every)
    if not m >= 1:
        raise ValueError(f"update_every must be >= 1 round, got {update_every}")
    if not gain > -1:
        raise ValueError(f"gain must be > -1, got {gain}")
    return (1 + gain) * vd / (vd + u / m)


def serial_break_even_gain(verify_seconds: float, draft_seconds: float, update_seconds: float,
                           update_every: float = 1.0) -> float:
    """The tau gain at which serial updates break even: u / (m (v + d))."""
    vd, u = _round(verify_seconds, draft_seconds, update_seconds)
    if not float(update_every) >= 1:
        raise ValueError(f"update_every must be >= 1 round, got {update_every}")
    return u / (float(update_every) * vd)


def background_update_interval(verify_seconds: float, draft_seconds: float, update_seconds: float,
                               slowdown: float) -> float:
    """m_bg = max(1, u_bg / (sigma (v + d))): rounds between background updates."""
    vd, u = _round(verify_seconds, draft_seconds, update_seconds)
    sigma = _slowdown(slowdown)
    return max(1.0, u / (sigma * vd))


def background_speedup(verify_seconds: float, draft_seconds: float, update_seconds: float, slowdown: float,
                       gain_curve: GainCurve) -> float:
    """S_bg = (1 + g(m_bg)) / sigma: online in a background worker on shared cores.

    Args:
        verify_seconds, draft_seconds: v, d per round with decoding alone on all cores.
        update_seconds: u_bg, seconds per update on the worker's threads.
        slowdown: sigma >= 1, the decoder's round time with the worker busy over its
            round time alone. gain_curve: g(m).
    """
    m = background_update_interval(verify_seconds, draft_seconds, update_seconds, slowdown)
    return (1 + gain_curve(m)) / float(slowdown)


def background_break_even_gain(slowdown: float) -> float:
    """The tau gain at which background updates on shared cores break even: sigma - 1."""
    return _slowdown(slowdown) - 1


def queued_background_speedup(verify_seconds: float, draft_seconds: float, update_seconds: float,
                              slowdown: float, gain: float) -> float:
    """S_queue = (1 + g) (v + d) / max(sigma (v + d), u_bg): every round's update queued for
    a background worker, the backlog drained at chunk ends (module docstring).

    Args:
        verify_seconds, draft_seconds: v, d per round with decoding alone on all cores.
        update_seconds: u_bg, seconds per update on the worker's threads (>= 0).
        slowdown: sigma >= 1, the decoder's round time beside the busy worker over its
            round time alone. gain: g, the tau gain of the late per-round updates (> -1).
    """
    vd, u = _round(verify_seconds, draft_seconds, update_seconds)
    sigma = _slowdown(slowdown)
    if not gain > -1:
        raise ValueError(f"gain must be > -1, got {gain}")
    return (1 + gain) * vd / max(sigma * vd, u)


def queued_break_even_gain(verify_seconds: float, draft_seconds: float, update_seconds: float,
                           slowdown: float) -> float:
    """The tau gain at which queued background updates break even: max(sigma, u_bg / (v + d)) - 1."""
    vd, u = _round(verify_seconds, draft_seconds, update_seconds)
    sigma = _slowdown(slowdown)
    return max(sigma, u / vd) - 1


def separate_device_speedup(verify_seconds: float, draft_seconds: float, update_seconds: float,
                            gain_curve: GainCurve, publish_seconds: float = 0.0, publish_every: int = 1) -> float:
    """S_dev = (1 + g(m_dev)) (v + d) / (v + d + publish / (N m_dev)), m_dev = max(1, u_dev / (v + d)).

    Args:
        update_seconds: u_dev, seconds per update on the learner's device.
        publish_seconds: seconds the decoder spends installing published weights.
        publish_every: N, updates per publication (int >= 1).
    """
    vd, u = _round(verify_seconds, draft_seconds, update_seconds)
    c = _positive("publish_seconds", publish_seconds, allow_zero=True)
    if int(publish_every) != publish_every or publish_every < 1:
        raise ValueError(f"publish_every must be an int >= 1, got {publish_every}")
    m = max(1.0, u / vd)
    return (1 + gain_curve(m)) * vd / (vd + c / (publish_every * m))


def placement_speedups(verify_seconds: float, draft_seconds: float, update_seconds: float, slowdown: float,
                       gain_curve: GainCurve, *, publish_seconds: float = 0.0, publish_every: int = 1) -> dict:
    """All three placements at once, with their break-even gains.

    Returns:
        dict: ``serial`` (S at m = 1), ``serial_break_even_gain``, ``background``,
        ``background_update_interval``, ``background_break_even_gain``,
        ``separate_device``, ``gain_every_round`` (g(1)).
    """
    g1 = gain_curve(1.0)
    return {"serial": serial_speedup(verify_seconds, draft_seconds, update_seconds, g1),
            "serial_break_even_gain": serial_break_even_gain(verify_seconds, draft_seconds, update_seconds),
            "background": background_speedup(verify_seconds, draft_seconds, update_seconds, slowdown, gain_curve),
            "background_update_interval": background_update_interval(verify_seconds, draft_seconds,
                                                                     update_seconds, slowdown),
            "background_break_even_gain": background_break_even_gain(slowdown),
            "separate_device": separate_device_speedup(verify_seconds, draft_seconds, update_seconds, gain_curve,
                                                       publish_seconds, publish_every),
            "gain_every_round": g1}


def implied_update_share(speedup_inference: float, speedup_with_training: float) -> dict:
    """What a paper's two speedups of one online method imply about its update cost.

    With T_f the frozen draft's time on a stream, T_i the online draft's inference time
    and T_u its training time, S_inf = T_f / T_i and S_train = T_f / (T_i + T_u); T_f
    cancels in T_u / T_i = S_inf / S_train - 1, the serial update seconds per inference
    second (u / (m (v + d)) of `serial_speedup`, summed over the stream), and in the wall
    share of training T_u / (T_i + T_u) = 1 - S_train / S_inf.

    Example (OnlineSpec Tables 1 and 6, Vicuna-7B on A800s): Opt-Hydra on Code-Search,
    1.31x without and 1.02x with training -> updates cost 0.28 s per inference second,
    22 % of the wall time.

    Args:
        speedup_inference: S_inf, online over frozen with training left out (> 0).
        speedup_with_training: S_train, with training time added (> 0).

    Returns:
        ``{"update_seconds_per_inference_second": T_u / T_i, "update_wall_share": T_u / (T_i + T_u)}``.

    Raises:
        ValueError: a speedup not finite and > 0, or S_train > S_inf (training cannot save time).
    """
    s_inf = _positive("speedup_inference", speedup_inference)
    s_train = _positive("speedup_with_training", speedup_with_training)
    if s_train > s_inf:
        raise ValueError(f"speedup with training {s_train} exceeds the speedup without it {s_inf}")
    return {"update_seconds_per_inference_second": s_inf / s_train - 1,
            "update_wall_share": 1 - s_train / s_inf}
