"""Test support: count the stream syncs a decode would make on an accelerator, on CPU.

The tensors of the given modules are marked as "device" tensors and a
`TorchFunctionMode` follows the mark through every op. A host read of a device tensor
(``.item()``, ``.tolist()``, ``.cpu()``, ``int()`` / ``float()`` / ``bool()``,
``.numpy()``, ``.to("cpu")``), a host tensor copied to the device
(``torch.tensor(..., device=<a device tensor's device>)`` / ``.to(device)`` of a host
tensor) and advanced indexing of a device tensor with a host list / tensor are each
counted as one sync. On CPU every device is "cpu", so the device side of a factory /
``.to`` is read from the caller's source line: ``device="cpu"`` (or a generator's
device) is the host, any other ``device=`` / ``.to(...)`` the device.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import linecache
import os
import sys
import traceback

import torch
from torch.overrides import TorchFunctionMode

_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "specloop")
_READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
_FACTORIES = {"zeros", "ones", "arange", "tensor", "full", "empty", "eye", "as_tensor", "rand", "randn",
              "from_numpy", "zeros_like", "ones_like", "full_like"}
_COPIES = {"tensor", "as_tensor", "from_numpy"}


def _dev(t) -> bool:
    return getattr(t, "_specloop_dev", False)


def _mark(obj, value: bool = True) -> None:
    for t in _tensors(obj, []):
        try:
            t._specloop_dev = value
        except Exception:  # noqa: BLE001 - some tensor subclasses refuse attributes
            pass


def _tensors(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


_FRAME = [None]
_DEVICE_OF = re.compile(r"(?:device=|\.to\()([A-Za-z_][\w\.\[\]]*?)\.device")


def _site():
    """(file:line, source line) of the innermost specloop frame, or (None, "")."""
    for frame, line in traceback.walk_stack(sys._getframe(2)):
        name = frame.f_code.co_filename
        if name.startswith(_ROOT):
            _FRAME[0] = frame
            return f"{os.path.relpath(name, os.path.dirname(_ROOT))}:{line}", linecache.getline(name, line)
    _FRAME[0] = None
    return None, ""


def _host_side(source: str, kwargs=None, args=()) -> bool:
    """Whether a factory's device= / a .to(...) names the host: the string "cpu", a
    generator's device, or ``<tensor>.device`` of a host tensor."""
    named = [kwargs.get("device")] if kwargs else []
    named += [a for a in args[1:] if isinstance(a, str)]
    if any(d == "cpu" for d in named if isinstance(d, str)) or "generator" in source:
        return True
    match = _DEVICE_OF.search(source)
    if match and _FRAME[0] is not None:
        try:
            obj = eval(match.group(1), _FRAME[0].f_globals, dict(_FRAME[0].f_locals))  # noqa: S307 - test support
            if isinstance(obj, torch.Tensor):
                return not _dev(obj)
        except Exception:  # noqa: BLE001 - an expression the frame cannot evaluate: assume the device
            pass
    return False


class SyncCounter(TorchFunctionMode):
    """Counts syncs per round (``round`` is advanced by the caller, e.g. from a
    patched ``DecodeSession.start_round``); ``sites`` counts them per source line."""

    def __init__(self):
        super().__init__()
        self.round = -1
        self.per_round = collections.Counter()
        self.sites = collections.Counter()

    def _count(self, kind: str, site) -> None:
        self.per_round[self.round] += 1
        self.sites[(kind, site)] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        ins = _tensors(args, []) + _tensors(kwargs, [])
        any_dev = any(_dev(t) for t in ins)
        site, source = _site()
        if site is not None:
            if name in _READS and any_dev:
                self._count("read " + name, site)
            has_dev = "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args[1:])
            if name == "to" and any_dev and has_dev and _host_side(source, kwargs, args):
                self._count("read to(host)", site)
            if name == "__getitem__" and _dev(args[0]) and len(args) > 1:
                idx = args[1] if isinstance(args[1], tuple) else (args[1],)
                if any(isinstance(i, list) or (isinstance(i, torch.Tensor) and not _dev(i) and i.ndim > 0)
                       for i in idx):
                    self._count("host index", site)
        out = func(*args, **kwargs)
        if name in _FACTORIES:
            if site is not None and kwargs.get("device") is not None and not _host_side(source, kwargs):
                _mark(out)
                if name in _COPIES:
                    self._count("copy " + name + "(device=)", site)
            elif any_dev and name.endswith("_like"):
                _mark(out)
        elif name == "to":
            has_dev = "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args[1:])
            if has_dev and site is not None and _host_side(source, kwargs, args):
                out = out.view_as(out) if out is ins[0] else out
                _mark(out, False)
            elif has_dev and site is not None:
                if not any_dev and ins[0].numel():
                    self._count("copy to(device)", site)
                out = out.view_as(out) if out is ins[0] and not any_dev else out
                _mark(out)
            elif any_dev:
                _mark(out)
        elif name == "cpu":
            out = out.view_as(out) if out is ins[0] else out
            _mark(out, False)
        elif name in ("numpy", "tolist", "item"):
            pass
        elif any_dev:
            _mark(out)
        return out


def mark_device(*modules) -> None:
    """Mark every parameter and buffer of ``modules`` (and plain tensors) as device tensors."""
    for m in modules:
        if isinstance(m, torch.Tensor):
            _mark(m)
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            _mark(t)


def unmark(*modules) -> None:
    for m in modules:
        if isinstance(m, torch.Tensor):
            _mark(m, False)
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            _mark(t, False)


def count_syncs(decoder, prompt: list[int], max_new_tokens: int, modules=()) -> tuple[list[int], SyncCounter, object]:
    """Decode ``prompt`` with ``decoder`` under a `SyncCounter`, ``modules`` (the
    target, the drafter's modules) marked as device tensors. Returns (syncs of each
    round, the counter, the `GenerationResult`)."""
    from specloop.realmodels import session as S
    counter = SyncCounter()
    original = S.DecodeSession.start_round

    def start_round(self, plan):
        counter.round += 1
        return original(self, plan)

    on_host = S._on_host

    def emulated_on_host(proposal):       # on CPU every tensor is "on the host": move marked ones
        tokens, parents = proposal.tokens.reshape(-1), proposal.parents
        if not (_dev(tokens) or _dev(parents)):
            return proposal
        if _dev(tokens) and _dev(parents):
            both = torch.stack([tokens.long(), parents.long()]).cpu()
            tokens, parents = both[0], both[1]
        else:
            tokens, parents = tokens.cpu(), parents.cpu()
        return dataclasses.replace(proposal, tokens=tokens, parents=parents)

    mark_device(decoder.model, *modules)
    S.DecodeSession.start_round, S._on_host = start_round, emulated_on_host
    try:
        with counter:
            result = decoder.generate(prompt, max_new_tokens=max_new_tokens)
    finally:
        S.DecodeSession.start_round, S._on_host = original, on_host
        unmark(decoder.model, *modules)
    rounds = len(result.trace)
    return [counter.per_round[r] for r in range(rounds)], counter, result
