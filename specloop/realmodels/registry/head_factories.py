"""Registry factories of the trained feature-head and small-LM drafters (``hydra``,
``medusa``, ``small-lm``) and the EAGLE / EAGLE-3 loader: the saved draft of a target,
loaded (or trained first with ``specloop draft train``'s trainer, `load_or_train`) and
wrapped in its drafter (`specloop.realmodels.heads.head_drafting`,
`specloop.realmodels.heads.small_lm`, `specloop.realmodels.heads.eagle_drafter`).
Registered by `specloop.realmodels.registry.heads`.
"""
from __future__ import annotations

import dataclasses

import torch

from specloop.realmodels.drafters.options import ContextOptions
from specloop.realmodels.heads.head_drafting import HydraDrafter, MedusaDrafter

__all__ = ["load_or_train", "load_eagle_drafter", "make_hydra_drafter", "make_medusa_drafter",
           "make_distilled_small_lm_drafter", "HeadOptions", "HybridOptions", "DistilledSmallLMOptions",
           "loader_options"]


def load_or_train(target, kind: str, *, folder=None, train_if_missing: bool = True, progress: bool = True,
                  train_config: dict | None = None) -> tuple[dict, dict]:
    """The saved draft of ``kind`` for ``target`` (a `LoadedModel`): the draft cache
    (or ``folder``), then the package's shipped float16 copy; trained first with
    ``specloop draft train``'s trainer (progress bars) when neither exists.

    Returns:
        (tensors, report) as `specloop.realmodels.heads.common.load_draft` gives them.

    Raises:
        FileNotFoundError: nothing saved and ``train_if_missing`` is False.
    """
    from specloop.realmodels.heads.common import load_draft
    name = str(target.name)
    try:
        return load_draft(name, kind, folder)
    except FileNotFoundError:
        if not train_if_missing:
            raise
    from specloop.realmodels.training.trainer import TrainConfig, get_trainer
    cfg = TrainConfig(target=name, kind=kind, out_dir=str(folder) if folder else None, **(train_config or {}))
    get_trainer(kind)(cfg, loaded=target, progress=progress)
    return load_draft(name, kind, folder)


def load_eagle_drafter(target, kind: str = "eagle", *, folder=None, train_if_missing: bool = True,
                       progress: bool = True, train_config: dict | None = None,
                       dtype: str | torch.dtype | None = None):
    """Load the saved EAGLE / EAGLE-3 draft of ``target`` (a `LoadedModel`), training
    it first (with progress bars) when none is saved and ``train_if_missing``.

    Looks in ``folder`` (or the draft cache, then the package's shipped float16 copy).
    ``dtype``: the head's dtype for drafting (None = float32, what online training
    needs); see `specloop.realmodels.heads.eagle_drafter.eagle_drafter_from_saved`.

    Raises:
        FileNotFoundError: no draft saved and ``train_if_missing`` is False.
        ValueError: the saved draft does not fit this target (other hidden size or
            vocabulary).
    """
    from specloop.realmodels.heads.eagle_drafter import eagle_drafter_from_saved
    tensors, meta = load_or_train(target, kind, folder=folder, train_if_missing=train_if_missing, progress=progress,
                                  train_config=train_config)
    return eagle_drafter_from_saved(target, kind, tensors, meta, dtype=dtype)


@dataclasses.dataclass(frozen=True)
class HeadOptions(ContextOptions):
    """Options of the trained heads ``eagle``, ``eagle3``, ``medusa`` and ``hydra``:
    the `ContextOptions` (``checkpoint`` = the draft folder, ``train_if_missing``,
    ``progress``; ``dtype`` = the EAGLE heads' drafting dtype, None = float32) and:

    Attributes:
        train_config (dict | None, None): `TrainConfig` fields for a head trained
            first (`load_or_train`).
    """
    kind = "head"

    train_config: dict | None = None


@dataclasses.dataclass(frozen=True)
class HybridOptions(HeadOptions):
    """Options of ``hybrid`` (a lookup where it proposes, else a trained head):
    `HeadOptions` (``checkpoint`` = the head's draft folder) and:

    Attributes:
        head (str, "eagle"): "eagle", "eagle3", "hydra" or "medusa".
        lookup (str, "ngram"): "ngram" (prompt lookup) or "suffix" (the suffix tree,
            `SuffixDrafter` with its defaults, the verify-cost column of
            ``suffix_dtype``).
        min_score (float, 0.0): as `HybridDrafter` (expected accepted tokens a
            lookup proposal needs).
        suffix_dtype (str, "float32"): the shipped verify-cost column the suffix
            lookup prices by (the target's dtype).
        min_ngram (int, 2), max_ngram (int, 4), max_matches (int, 4): as `HybridDrafter`.
    """
    kind = "hybrid"

    head: str = "eagle"
    lookup: str = "ngram"
    min_score: float = 0.0
    suffix_dtype: str = "float32"
    min_ngram: int = 2
    max_ngram: int = 4
    max_matches: int = 4


@dataclasses.dataclass(frozen=True)
class DistilledSmallLMOptions(HeadOptions):
    """Options of ``small-lm`` with the trained heads: `HeadOptions` (the distilled
    small LM) and, to use a separate model instead (`make_small_lm_drafter`):

    Attributes:
        model (str | None, None): a draft model name / path; None = the distilled LM.
        retokenize (bool | None, None): as `SmallLMOptions` (with ``model`` only).
    """
    kind = "small-lm"

    model: str | None = None
    retokenize: bool | None = None


def loader_options(opts: HeadOptions) -> dict:
    """`load_or_train`'s keyword arguments from a head kind's options."""
    return {"folder": opts.checkpoint or None, "train_if_missing": bool(opts.train_if_missing),
            "progress": bool(opts.progress), "train_config": opts.train_config}


def _on_target_device(module: torch.nn.Module, target) -> torch.nn.Module:
    return module.to(next(target.model.parameters()).device)


def make_hydra_drafter(target, **options) -> HydraDrafter:
    """Registry factory ``hydra``: the trained Hydra heads of ``target`` (trained
    first if none is saved).

    Args:
        **options: the fields of `HeadOptions` (``checkpoint`` = a draft folder,
            ``train_if_missing``, ``progress``, ``train_config``; ``dtype`` ignored).

    Raises:
        ValueError: an option `HeadOptions` does not declare or a wrong type.
        FileNotFoundError: nothing saved and ``train_if_missing`` is False.
    """
    from specloop.realmodels.heads.hydra import hydra_from_saved
    opts = HeadOptions.from_options(options, drafter="hydra")
    tensors, report = load_or_train(target, "hydra", **loader_options(opts))
    drafter = HydraDrafter(_on_target_device(hydra_from_saved(target.model, tensors, report), target))
    drafter.train_report = report
    return drafter


def make_medusa_drafter(target, **options) -> MedusaDrafter:
    """Registry factory ``medusa`` (options and errors as `make_hydra_drafter`)."""
    from specloop.realmodels.heads.medusa import medusa_from_saved
    opts = HeadOptions.from_options(options, drafter="medusa")
    tensors, report = load_or_train(target, "medusa", **loader_options(opts))
    drafter = MedusaDrafter(_on_target_device(medusa_from_saved(target.model, tensors, report), target))
    drafter.train_report = report
    return drafter


def make_distilled_small_lm_drafter(target, **options):
    """Registry factory ``small-lm``: the small LM distilled from ``target`` (trained
    first if none is saved). With a ``model`` option (``--draft <model name>``,
    which the decoder's registry routes here) it delegates to the decoder's
    separate-model factory `specloop.realmodels.drafters.small_lm.make_small_lm_drafter`
    (``dtype``, ``device``, ``retokenize``).

    Args:
        **options: the fields of `DistilledSmallLMOptions`.

    Raises:
        ValueError: an option `DistilledSmallLMOptions` does not declare or a wrong
            type. FileNotFoundError: nothing saved and ``train_if_missing`` is False.
    """
    opts = DistilledSmallLMOptions.from_options(options)
    if opts.model:
        from specloop.realmodels.drafters.small_lm import make_small_lm_drafter
        return make_small_lm_drafter(target, opts.model, dtype=opts.dtype, device=opts.device,
                                     retokenize=opts.retokenize)
    from specloop.realmodels.heads.small_lm import SmallLMDraftDrafter, small_lm_from_saved
    tensors, report = load_or_train(target, "small-lm", **loader_options(opts))
    drafter = SmallLMDraftDrafter(_on_target_device(small_lm_from_saved(target.model, tensors, report), target))
    drafter.train_report = report
    return drafter
