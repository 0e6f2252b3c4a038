"""``specloop draft``: offline training of learned drafts for a real target.

    specloop draft train --target smollm2-135m --kind eagle|eagle3|medusa|hydra|small-lm
                         [--tokens N] [--steps S] [--corpus-mix SRC=W,...] [--quick] [--json]
                         [--init-from FOLDER|pretrained [--revocab]]
                         [--from-recording REC ... [--recording-positions continuation|all]
                          [--soft-targets]]
    specloop draft features --target smollm2-135m [--tokens N] [--corpus-mix SRC=W,...]
    specloop draft export --target smollm2-135m --kind eagle|eagle3|medusa|KIND:PATH
                          --format eagle|eagle3|medusa|vllm-medusa --out DIR [--checkpoint FOLDER]
    specloop draft datastore --target smollm2-135m [--tokens N] [--no-chat]

``datastore`` builds (or finds) the ``ngram-datastore`` drafter's n-gram index of the
target's warm-up corpus (`specloop.realmodels.registry.datastore`) and prints its folder.

``export`` writes a draft head in a published layout (EAGLE-1/2, EAGLE-3, Medusa;
``vllm-medusa``: vLLM's Medusa layout; `specloop.realmodels.heads.published_export`): the
target's saved draft of that kind (the draft cache, ``--checkpoint`` or the shipped
copy; never trained here), or a published checkpoint ``KIND:PATH`` re-written. Heads
that do not convert exactly are refused with the reason (exit 2); what vLLM's method
would not run exactly is printed to stderr as ``note:`` lines.

``train`` dispatches through `specloop.realmodels.training.trainer.get_trainer`; the
target's feature cache (teacher-forced features of the warm-up corpus) is built
first when missing (progress bars; resumable). ``--quick`` trains a small draft on a
small separate cache (``<target>-quick``) in a few minutes, for smoke tests.
``--corpus-mix stdlib=0.6,docs=0.2,man=0.2`` chooses the warm-up corpus sources
(`specloop.realmodels.training.corpus.SOURCES`); a non-default mix gets its own
feature cache (``<target>-mix-...``), e.g. a draft that never saw the prompt
datasets or the target's chat responses, for a domain-shift stream.
``--from-recording REC`` (repeatable) trains on stream recordings instead
(`specloop.realmodels.training.recording_data`): the target's own greedy answers to the
recorded prompts (self-distillation, as Medusa-2 / EAGLE-3 train), features read from
the recording's float16 hidden states (no target forward), every 10th prompt held out;
a recording made by another target or missing a layer the head reads is refused.
``--json`` prints the training report (keys include ``kind``, ``target``,
``heldout_top1``, ``train_seconds``, ``path``). Exit 0 on success, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json

__all__ = ["register"]

KINDS = ("eagle", "eagle3", "medusa", "hydra", "small-lm")
QUICK = {"tokens": 40_000, "steps": 200, "batch_size": 4, "window": 64}
_MIX_HELP = ("source weights of the warm-up corpus, e.g. stdlib=0.6,docs=0.2,man=0.2 (sources: stdlib, docs, man, "
             "prompts; default stdlib=0.45,docs=0.2,man=0.2,prompts=0.15); a non-default mix gets its own feature cache")


def register(subparsers) -> None:
    parser = subparsers.add_parser("draft", help="train learned drafts (EAGLE, EAGLE-3, Medusa, Hydra, small LM)")
    sub = parser.add_subparsers(dest="draft_command", metavar="ACTION")
    sub.required = True
    train = sub.add_parser("train", help="train a draft offline on target features of real text")
    train.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    train.add_argument("--kind", required=True, choices=KINDS)
    train.add_argument("--tokens", type=int, default=None, help="warm-up corpus size in tokens (default 1.2M)")
    train.add_argument("--steps", type=int, default=None, help="optimizer steps")
    train.add_argument("--batch-size", type=int, default=None)
    train.add_argument("--window", type=int, default=None, help="positions per training window (tokens)")
    train.add_argument("--ttt-steps", type=int, default=None, help="draft steps unrolled in training")
    train.add_argument("--vocab-size", type=int, default=None, help="reduced draft vocabulary (0 = auto)")
    train.add_argument("--lr", type=float, default=None)
    train.add_argument("--time-limit", type=float, default=None, help="stop training after this many seconds")
    train.add_argument("--init-from", default=None,
                       help="continue training a saved draft of the same kind: a draft folder, or 'pretrained' "
                            "for the copy shipped in the package (its reduced vocabulary is kept unless --revocab)")
    train.add_argument("--revocab", action="store_true",
                       help="with --init-from: rebuild the reduced vocabulary from this run's "
                            "data (--vocab-size, default the 95 %% coverage rule), keeping the trained rows of "
                            "the tokens both vocabularies share")
    train.add_argument("--corpus-mix", default=None, help=_MIX_HELP)
    train.add_argument("--from-recording", action="append", default=None, metavar="REC", dest="recordings",
                       help="train on a stream recording (`specloop stream record`, repeatable): the target's own "
                            "greedy answers, features read from the recording, no target forward; every "
                            "10th prompt is held out")
    train.add_argument("--recording-positions", choices=("continuation", "all"), default=None,
                       help="label positions of a recording: the target's answers (continuation, default) or "
                            "prompt positions too (all)")
    train.add_argument("--soft-targets", action="store_true",
                       help="with --from-recording: distil the recorded top-m p_target (default: the greedy token)")
    train.add_argument("--quick", action="store_true", help="small cache and few steps (minutes)")
    train.add_argument("--out", default=None, help="draft folder (default: the draft cache)")
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    train.set_defaults(func=_train)
    feats = sub.add_parser("features", help="build the target's warm-up feature cache (resumable)")
    feats.add_argument("--target", default="smollm2-135m")
    feats.add_argument("--tokens", type=int, default=1_200_000)
    feats.add_argument("--dtype", default="bfloat16", help="target dtype for extraction")
    feats.add_argument("--no-chat", action="store_true", help="skip the target's own chat responses")
    feats.add_argument("--corpus-mix", default=None, help=_MIX_HELP)
    feats.set_defaults(func=_features)
    export = sub.add_parser("export", help="write a draft head in a published layout (EAGLE, EAGLE-3, Medusa, "
                                           "vLLM's Medusa)")
    export.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    export.add_argument("--kind", required=True,
                        help="eagle, eagle3 or medusa (the target's trained draft), or KIND:PATH (a published one)")
    export.add_argument("--format", required=True, choices=("eagle", "eagle3", "medusa", "vllm-medusa"),
                        dest="fmt", help="published layout (vllm-medusa: vLLM's medusa method)")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--checkpoint", default=None, help="draft folder of the trained draft (default: the cache)")
    export.set_defaults(func=_export)
    store = sub.add_parser("datastore", help="build the ngram-datastore drafter's index of the warm-up corpus")
    store.add_argument("--target", default="smollm2-135m", help="target model (registry name, HF id or path)")
    store.add_argument("--tokens", type=int, default=1_200_000, help="warm-up corpus size in tokens")
    store.add_argument("--no-chat", action="store_true", help="do not index the target's cached chat responses")
    store.set_defaults(func=_datastore)


def _datastore(args: argparse.Namespace) -> int:
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.registry.datastore import datastore_root, load_or_build_index
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
    index = load_or_build_index(load_model(args.target), args.target, total_tokens=args.tokens,
                                include_chat=not args.no_chat)
    print(f"n-gram datastore index of {args.target} ({len(index.tokens)} tokens) under {datastore_root(args.target)}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from specloop.realmodels.registry.drafters import make_drafter
    import sys

    from specloop.realmodels.heads.published_export import export_published, vllm_notes
    from specloop.realmodels.loading import load_model
    if args.kind not in ("eagle", "eagle3", "medusa") and args.kind.partition(":")[0] not in ("eagle", "eagle3",
                                                                                              "medusa"):
        raise ValueError(f"--kind must be eagle, eagle3, medusa or KIND:PATH with one of those kinds, "
                         f"got {args.kind!r}")
    from specloop.cli._paths import check_paths
    check_paths(args, out_folders=("out",), in_folders=("checkpoint",))
    target = load_model(args.target)
    drafter = make_drafter(args.kind, target, checkpoint=args.checkpoint, train_if_missing=False, progress=False)
    folder = export_published(drafter, args.fmt, args.out, target)
    print(f"wrote {args.kind} for {args.target} as {args.fmt} to {folder}")
    for note in vllm_notes(folder, args.fmt):
        print(f"note: {note}", file=sys.stderr)
    return 0


def _recording_values(args) -> dict:
    """TrainConfig fields of ``--from-recording`` (refusing options that do not apply)."""
    if not args.recordings:
        if args.recording_positions is not None or args.soft_targets:
            raise ValueError("--recording-positions and --soft-targets need --from-recording")
        return {}
    if args.corpus_mix is not None or args.tokens is not None:
        raise ValueError("--corpus-mix and --tokens choose the feature cache; they do not apply to --from-recording")
    from specloop.realmodels.recording import open_recording
    for folder in args.recordings:                  # refused before the target loads
        recorded = open_recording(folder).settings.get("target")
        if recorded != args.target:
            raise ValueError(f"{folder} was recorded with target {recorded!r}, not {args.target!r}")
        if open_recording(folder).settings.get("split") != "warmup":
            import sys
            print(f"warning: {folder} is not a warm-up split recording; its prompts may be benchmark "
                  "prompts (record one with `specloop stream record --split warmup`)", file=sys.stderr)
    return {"recordings": tuple(args.recordings), "recording_positions": args.recording_positions or "continuation",
            "recording_soft_targets": bool(args.soft_targets)}


def _train_config(args):
    from specloop.realmodels.training.corpus import parse_mix
    from specloop.realmodels.training.features import mix_features_root
    from specloop.realmodels.training.trainer import TrainConfig
    recording = _recording_values(args)
    values = dict(QUICK) if args.quick else {}
    if recording and args.quick:
        values.pop("tokens")
    values.update(recording)
    if args.corpus_mix is not None:
        values["corpus_mix"] = parse_mix(args.corpus_mix)
    for key, attr in (("tokens", "tokens"), ("steps", "steps"), ("batch_size", "batch_size"),
                      ("window", "window"), ("ttt_steps", "ttt_steps"), ("draft_vocab_size", "vocab_size"),
                      ("lr", "lr"), ("time_limit_s", "time_limit"), ("init_from", "init_from")):
        if getattr(args, attr) is not None:
            values[key] = getattr(args, attr)
    if args.quick:
        if not recording:
            values["feature_root"] = str(mix_features_root(f"{args.target}-quick", values.get("corpus_mix")))
        values["quick"] = True
    if args.revocab:
        if values.get("init_from") is None:
            raise ValueError("--revocab needs --init-from")
        values["revocab"] = True
    if values.get("init_from") == "pretrained":
        values["init_from"] = _pretrained_folder(args.target, args.kind)
    return TrainConfig(target=args.target, kind=args.kind, out_dir=args.out, **values)


def _pretrained_folder(target: str, kind: str) -> str:
    """A draft folder (``draft.safetensors`` + ``draft.json``) holding the package's
    shipped copy of (target, kind), so training can continue from it.

    Raises:
        FileNotFoundError: the package ships no draft of this kind for this target.
    """
    import shutil
    import tempfile
    from pathlib import Path

    from specloop.realmodels.heads.common import pretrained_path
    shipped = pretrained_path(target, kind)
    if not (shipped.is_file() and shipped.with_suffix(".json").is_file()):
        raise FileNotFoundError(f"the package ships no {kind!r} draft for {target!r} ({shipped}); "
                                "train one first or pass a draft folder to --init-from")
    folder = Path(tempfile.mkdtemp(prefix=f"specloop-init-{kind}-"))
    shutil.copyfile(shipped, folder / "draft.safetensors")
    shutil.copyfile(shipped.with_suffix(".json"), folder / "draft.json")
    return str(folder)


def _train(args: argparse.Namespace) -> int:
    from specloop.cli._paths import check_paths
    from specloop.realmodels.training.trainer import get_trainer
    check_paths(args, out_folders=("out",), in_folders=("recordings=--from-recording",)
                + (("init_from",) if args.init_from not in (None, "pretrained") else ()))
    config = _train_config(args)
    trainer = get_trainer(args.kind)
    report = trainer(config, loaded=None, progress=True)
    summary = {"kind": args.kind, "target": args.target, **{k: v for k, v in report.items()
                                                              if k not in ("config", "train_config")}}
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    else:
        top1 = summary.get("heldout_top1")
        print(f"trained {args.kind} for {args.target}: held-out top-1 "
              f"{top1 if top1 is None else round(float(top1), 4)}, saved to {summary.get('path')}")
    return 0


def _features(args: argparse.Namespace) -> int:
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.training.corpus import parse_mix
    from specloop.realmodels.training.features import build_feature_cache, mix_features_root
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
    mix = parse_mix(args.corpus_mix) if args.corpus_mix is not None else None
    loaded = load_model(args.target, dtype=args.dtype)
    parts = ("val", "train") if args.no_chat else ("val", "train", "chat")
    built = build_feature_cache(loaded, args.target, total_tokens=args.tokens, parts=parts, mix=mix,
                                root=mix_features_root(args.target, mix))
    for name, part in built.items():
        print(f"{name}: {part.n_done}/{part.meta['n_chunks']} chunks of {part.meta['chunk_len']} tokens "
              f"in {part.folder}")
    return 0
