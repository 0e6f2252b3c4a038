"""``specloop draft``: offline training of learned drafts for a real target.

    specloop draft train --target smollm2-135m --kind eagle|eagle3|medusa|hydra|small-lm
                         [--arch specloop|published] (eagle3 only)
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
``--arch published`` (``--kind eagle3``) trains EAGLE-3's own layer instead of specloop's
fused one (`specloop.realmodels.heads.eagle3_arch`); ``export --format eagle3`` writes
such a head (and only such a head) in the published layout vLLM's eagle3 method reads.
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
    train.add_argument("--arch", choices=("specloop", "published"), default=None,
                       help="with --kind eagle3: the head's layer. specloop (default): [norm(emb); norm(g)] fused "
                            "2H -> H before attention; published: EAGLE-3's own layer (q/k/v over "
                            "[input_layernorm(emb); hidden_norm(g)], residual g), the only one `draft export "
                            "--format eagle3` writes (the layout vLLM's eagle3 method reads). Saved in draft.json; "
                            "loading rebuilds it")
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
    train.add_argument("--from-answers", action="append", default=None, metavar="SET", dest="answer_sets",
                       help="train on an answer set (data/answers/<name>, repeatable): its recording is rebuilt by "
                            "teacher-forced prefill into a cache outside the repository (or reused, checked by the "
                            "set's manifest hash and the feature layers); the reduced vocabulary comes from the "
                            "sets' answer-token counts; every 10th prompt is held out")
    train.add_argument("--features-dir", default=None, metavar="DIR",
                       help="cache folder of the recordings rebuilt from answer sets (default: under the "
                            "target's feature cache)")
    train.add_argument("--eval-answers", default=None, metavar="SET",
                       help="held-out answer set (e.g. data/answers/sharegpt-heldout-1200): its first "
                            "--eval-prompts prompts are rebuilt and give the report's eval top-1, vocabulary "
                            "coverage and tau (chain k = 2..6, dynamic tree)")
    train.add_argument("--eval-prompts", type=int, default=None, help="prompts of --eval-answers (default 100)")
    train.add_argument("--epochs", type=int, default=None,
                       help="resumable run of N passes over the training items (2-3 is the guidance), "
                            "checkpointed every piece; rerunning the same command resumes")
    train.add_argument("--checkpoint-every", default=None, metavar="N|Mm",
                       help="with --epochs: piece length in steps (500) or minutes (10m; default)")
    train.add_argument("--budget-minutes", type=float, default=None,
                       help="with --epochs: stop at the piece boundary before M minutes of training, with a "
                            f"checkpoint (exit {EXIT_BUDGET}); rerun the same command to resume")
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


def _recording_values(args, rebuilt=()) -> dict:
    """TrainConfig fields of ``--from-recording`` and of the recordings ``rebuilt`` from
    ``--from-answers`` (refusing options that do not apply)."""
    if rebuilt:
        given = _recording_values(args) if args.recordings else {}
        return {"recordings": tuple(given.get("recordings", ())) + tuple(rebuilt),
                "recording_positions": args.recording_positions or "continuation",
                "recording_soft_targets": bool(args.soft_targets), "vocab_from_answers": True}
    if not args.recordings:
        if args.recording_positions is not None or args.soft_targets:
            raise ValueError("--recording-positions and --soft-targets need --from-recording or --from-answers")
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


def _train_config(args, rebuilt=(), evals=()):
    from specloop.realmodels.training.corpus import parse_mix
    from specloop.realmodels.training.features import mix_features_root
    from specloop.realmodels.training.trainer import TrainConfig
    recording = _recording_values(args, rebuilt)
    recording.update(_epoch_values(args, evals))
    values = dict(QUICK) if args.quick else {}
    if getattr(args, "arch", None) is not None:
        if args.kind != "eagle3":
            raise ValueError(f"--arch chooses the EAGLE-3 layer: it needs --kind eagle3, not {args.kind}")
        values["arch"] = args.arch
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


def _epoch_values(args, evals=()) -> dict:
    """TrainConfig fields of ``--epochs``, ``--checkpoint-every``, ``--budget-minutes``
    and the evaluation recordings."""
    values = {"eval_recordings": tuple(evals)} if evals else {}
    if getattr(args, "epochs", None) is None:
        return values
    from specloop.realmodels.training.epoch_loop import parse_checkpoint_every
    steps, minutes = parse_checkpoint_every(args.checkpoint_every or "10m")
    return {**values, "epochs": args.epochs, "checkpoint_every_steps": steps, "checkpoint_every_minutes": minutes,
            "budget_minutes": args.budget_minutes}


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
    check_paths(args, out_folders=("out", "features_dir=--features-dir"),
                in_folders=("recordings=--from-recording", "answer_sets=--from-answers", "eval_answers=--eval-answers")
                + (("init_from",) if args.init_from not in (None, "pretrained") else ()))
    _check_answer_args(args)
    if args.arch is not None and args.kind != "eagle3":       # before any recording is rebuilt
        raise ValueError(f"--arch chooses the EAGLE-3 layer: it needs --kind eagle3, not {args.kind}")
    if args.answer_sets or args.epochs is not None:
        return _train_resumable(args)
    config = _train_config(args)
    trainer = get_trainer(args.kind)
    report = trainer(config, loaded=None, progress=True)
    return _print_report(args, report)


def _train_resumable(args: argparse.Namespace) -> int:
    """``--from-answers`` / ``--epochs``: recordings rebuilt or reused, the (epoch) run
    under the draft folder's lock, then the held-out tau into ``train_report.json``."""
    import sys
    from pathlib import Path

    from specloop._folder_lock import folder_lock
    from specloop.realmodels.heads.common import draft_dir
    from specloop.realmodels.loading import load_model
    from specloop.realmodels.training.epoch_loop import write_train_report
    from specloop.realmodels.training.trainer import get_trainer
    models: dict = {}

    def load(dtype: str):
        if dtype not in models:
            models[dtype] = load_model(args.target, dtype=dtype)
        return models[dtype]

    folder = Path(args.out) if args.out else draft_dir(args.target, args.kind)
    folder.mkdir(parents=True, exist_ok=True)
    with folder_lock(folder):
        rebuilt, evals = _answer_recordings(args, load, folder)
        config = _train_config(args, rebuilt, evals)
        if args.out is None:
            config.out_dir = str(folder)
        report = get_trainer(args.kind)(config, loaded=load("float32"), progress=not args.json)
        if not report.get("complete", True):
            print(f"specloop draft train: stopped by --budget-minutes at step {report['steps']}/"
                  f"{report['total_steps']} (epoch {report['epochs_done']:.2f} of {report['epochs']}); checkpoint in "
                  f"{folder}; rerun the same command to resume", file=sys.stderr)
            if args.json:
                print(json.dumps(report, indent=1, default=str))
            return EXIT_BUDGET
        if evals:
            report["heldout_tau"] = heldout_tau(folder, args.kind, load("float32"), evals[0])
            write_train_report(folder, report)
    return _print_report(args, report)


def _print_report(args: argparse.Namespace, report: dict) -> int:
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


# -- training on answer sets (--from-answers): cached rebuilt recordings, epochs, report ----------------

TAU_KS = (2, 3, 4, 5, 6)
TAU_TREE = "topk=4,depth=5,v=16"     # the EAGLE-2 dynamic tree of benchmarks/heads_recording_tau.py
EXIT_BUDGET = 3                      # an epoch run stopped by --budget-minutes (rerun to resume)


def answers_key(answers, prompts: int, layers, top_m: int, feature_dtype: str = "float16") -> str:
    """sha256 naming the recording rebuilt from an answer set's first ``prompts``
    prompts: the set's settings (but the planned prompt count), target and tokenizer
    fingerprints, EOS ids and the listed size / sha256 of every piece those prompts lie
    in, plus the feature layers, ``top_m`` and feature dtype. Pieces a growing set
    appends later do not change it."""
    import hashlib
    manifest, used, pieces = answers.manifest, 0, []
    for entry in manifest["pieces"]:
        if used >= prompts:
            break
        pieces.append([entry["file"], int(entry["prompts"]), int(entry["bytes"]), entry["sha256"]])
        used += int(entry["prompts"])
    settings = {k: v for k, v in manifest["settings"].items() if k != "prompts"}
    key = {"settings": settings, "target_fingerprint": manifest["target_fingerprint"],
           "tokenizer_sha256": manifest["tokenizer_sha256"], "eos_ids": manifest["eos_ids"], "pieces": pieces,
           "prompts": int(prompts), "layers": [int(x) for x in layers], "top_m": int(top_m),
           "feature_dtype": feature_dtype}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def answers_recording(load, answers_dir, root, *, prompts: int | None = None, top_m: int = 32,
                      progress: bool = True) -> str:
    """The recording of an answer set's first ``prompts`` prompts (None: all listed),
    rebuilt by teacher-forced prefill (`answers.rebuild.rebuild_recording`) into
    ``root/<set>-<prompts>p-<key>`` (`answers_key`), or reused when that folder holds a
    complete recording with the same key; an interrupted rebuild resumes by shard.

    Args:
        load: ``load(dtype) -> LoadedModel`` of the set's target (the set's own dtype is
            asked for; its fingerprint is checked). answers_dir: the answer set.
        root: cache folder (outside the repository; features are never committed).

    Returns:
        the recording folder.

    Raises:
        ValueError / FileNotFoundError: as `open_answer_set` and `rebuild_recording`.
    """
    from pathlib import Path

    from specloop.realmodels.answers.answer_set import open_answer_set
    answers = open_answer_set(answers_dir)
    count = answers.num_prompts if prompts is None else int(prompts)
    if not 1 <= count <= answers.num_prompts:
        raise ValueError(f"asked for {prompts} prompts; {answers_dir} holds {answers.num_prompts}")
    target = load(answers.settings["dtype"])
    from specloop.realmodels.recording import head_feature_layers
    key = answers_key(answers, count, head_feature_layers(target.model.config), top_m)
    folder = Path(root) / f"{Path(answers_dir).resolve().name}-{count}p-{key[:12]}"
    source = {"answers": str(Path(answers_dir).resolve()), "prompts": count, "key": key}
    marker = folder / "source.json"
    if marker.is_file() and json.loads(marker.read_text()) != source:
        raise ValueError(f"{folder} holds a recording of other answers ({marker}); delete it to rebuild")
    manifest = folder / "manifest.json"
    if marker.is_file() and manifest.is_file() and json.loads(manifest.read_text()).get("complete"):
        from specloop.realmodels.recording import open_recording
        open_recording(folder)                          # every shard's size / sha256 verified
        return str(folder)
    import sys

    from tqdm.auto import tqdm

    from specloop.realmodels.answers.rebuild import rebuild_recording
    folder.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(source, indent=1))
    bar = tqdm(desc=f"rebuild {Path(answers_dir).name}", unit="prompt", disable=not progress, file=sys.stderr)
    try:
        rebuild_recording(target, answers_dir, folder, prompts=count, top_m=top_m,
                          progress=lambda done, total: (setattr(bar, "total", total), bar.update(done - bar.n)))
    finally:
        bar.close()
    return str(folder)


def heldout_tau(folder, kind: str, target, recording_folder, *, ks=TAU_KS, tree: str = TAU_TREE) -> dict:
    """Held-out mean accepted length tau (tokens per round, bonus token included) of a
    saved draft on every prompt of a recording, by exact greedy replay
    (`streams.replay.ReplayDecoder`, as ``benchmarks/heads_recording_tau.py``): one
    row per plan ``chain-k<K>`` and ``tree`` with ``tau``, ``rounds`` and ``tokens``,
    plus ``prompts``, ``tree_shape`` and ``seconds``.

    Args:
        folder: the draft folder. kind: its kind. target: the float32 `LoadedModel`.
        recording_folder: a greedy recording of held-out prompts."""
    import time

    from specloop.realmodels.policy import FixedDraftPolicy, parse_tree_shape
    from specloop.realmodels.recording import open_recording, recorded_items
    from specloop.realmodels.registry.drafters import make_drafter
    from specloop.realmodels.streams.replay import ReplayDecoder
    t0 = time.perf_counter()
    rec = open_recording(recording_folder)
    items = recorded_items(rec)
    drafter = make_drafter(kind, target, checkpoint=str(folder), train_if_missing=False, progress=False)
    shape = parse_tree_shape(tree)
    policies = {f"chain-k{k}": FixedDraftPolicy(int(k)) for k in ks}
    policies["tree"] = FixedDraftPolicy(shape.max_depth, shape)
    out = {"prompts": len(items), "tree_shape": tree}
    for name, policy in policies.items():
        tokens = []
        for item in items:
            decoder = ReplayDecoder(rec, target, drafter, policy=policy, seed=item.index)
            result = decoder.generate(list(item.ids), rec.prompt(item.index)["new_tokens"], stream_index=item.index)
            tokens += [r.tokens_per_round for r in result.trace]
        out[name] = {"tau": sum(tokens) / len(tokens) if tokens else None, "rounds": len(tokens),
                     "tokens": int(sum(tokens))}
    out["seconds"] = time.perf_counter() - t0
    return out


def _answers_root(args):
    from pathlib import Path

    from specloop.realmodels.training.features import features_root
    return Path(args.features_dir) if args.features_dir else features_root(args.target) / "answer-recordings"


def _pinned_prompts(out_folder) -> dict:
    """answer-set path -> prompts of the recordings an existing epoch checkpoint in
    ``out_folder`` trained on (so a growing set resumes on the same prompts)."""
    from pathlib import Path

    from specloop.realmodels.training.epoch_loop import CHECKPOINT_NAME
    path = Path(out_folder) / CHECKPOINT_NAME
    if not path.is_file():
        return {}
    import torch
    state = torch.load(path, weights_only=False, mmap=True, map_location="cpu")
    pinned = {}
    for rec in state.get("signature", {}).get("recordings", []):
        marker = Path(rec) / "source.json"
        if marker.is_file():
            source = json.loads(marker.read_text())
            pinned[source["answers"]] = int(source["prompts"])
    return pinned


def _check_answer_args(args) -> None:
    """Refuse flag combinations that do not apply, before any model loads."""
    if args.epochs is None:
        for flag, value in (("--budget-minutes", args.budget_minutes), ("--checkpoint-every", args.checkpoint_every)):
            if value is not None:
                raise ValueError(f"{flag} needs --epochs (a resumable epoch run)")
    else:
        if args.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {args.epochs}")
        if args.steps is not None or args.time_limit is not None:
            raise ValueError("--epochs sets the run's length; --steps and --time-limit do not apply (use "
                             "--budget-minutes to stop and resume)")
        if not (args.answer_sets or args.recordings):
            raise ValueError("--epochs trains on --from-answers or --from-recording")
    if args.eval_answers is None and args.eval_prompts is not None:
        raise ValueError("--eval-prompts needs --eval-answers")
    if args.eval_prompts is not None and args.eval_prompts < 1:
        raise ValueError(f"--eval-prompts must be >= 1, got {args.eval_prompts}")
    if (args.answer_sets or args.eval_answers) and (args.corpus_mix is not None or args.tokens is not None):
        raise ValueError("--corpus-mix and --tokens choose the feature cache; they do not apply to --from-answers")
    if args.eval_answers is not None and not (args.answer_sets or args.recordings):
        raise ValueError("--eval-answers evaluates a run on --from-answers or --from-recording")
    if args.features_dir is not None and not (args.answer_sets or args.eval_answers):
        raise ValueError("--features-dir holds the recordings rebuilt from --from-answers / --eval-answers")


def _answer_recordings(args, load, out_folder) -> tuple[list, list]:
    """(training recordings, evaluation recordings) rebuilt or reused from the answer sets."""
    from pathlib import Path
    root, pinned = _answers_root(args), _pinned_prompts(out_folder)
    train = [answers_recording(load, s, root, prompts=pinned.get(str(Path(s).resolve())), progress=not args.json)
             for s in args.answer_sets or ()]
    evals = [] if args.eval_answers is None else [
        answers_recording(load, args.eval_answers, root, prompts=args.eval_prompts or 100, progress=not args.json)]
    return train, evals
