"""The online-adaptation flags shared by ``specloop stream``, ``stream check-replay``
and ``stream scale`` (one definition, so the three read the same `OnlineConfig` fields
with the same defaults and validation)."""
from __future__ import annotations

__all__ = ["add_online_flags", "online_flags"]


def add_online_flags(parser, *, mode_default: str = "chunk", lr: bool = True, background: bool = False) -> None:
    """Add --mode, --lr (unless ``lr`` is False: the grid sets rates per job),
    --batch-size, --update-every, --epochs, --precondition, --ensemble-losses,
    --stacked-oracle and, with ``background``, --background and --publish-every."""
    from specloop.strategies.precondition import PRECONDITIONERS
    parser.add_argument("--mode", choices=["round", "chunk"], default=mode_default,
                        help="chunk (the paper's App. B set-up): epochs over each chunk's samples after the chunk; "
                             "round: a micro-update from a replay buffer every round"
                             f" (default {mode_default})")
    if lr:
        parser.add_argument("--lr", type=float, default=None, help="learner step size (default per learner)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--update-every", type=int, default=1, help="rounds between micro-updates (round mode)")
    parser.add_argument("--epochs", type=int, default=2, help="passes per chunk (chunk mode)")
    parser.add_argument("--precondition", choices=PRECONDITIONERS, default="none",
                        help="rms: divide the learner's gradients by their running RMS (adaptive OGD, "
                             "Adam-like per-element steps of size --lr); none: raw gradients")
    parser.add_argument("--ensemble-losses", choices=["exact", "linearised"], default="exact",
                        help="ensembles (ens-*, optens-*): exact = each base learner's own loss and gradient "
                             "(N evaluations a round, the paper); linearised = the Ader / Sword++ surrogate "
                             "from the played point's gradient (one evaluation a round)")
    parser.add_argument("--stacked-oracle", action="store_true",
                        help="exact ensembles: evaluate the N base learners in one vmapped call (faster on "
                             "an accelerator, slower on a CPU at one thread; same numbers)")
    if background:
        parser.add_argument("--background", action="store_true",
                            help="update on a worker thread (App. B.2) that trains a private copy of the draft")
        parser.add_argument("--publish-every", type=int, default=1, metavar="N",
                            help="with --background: learner steps between copies of the trained weights into "
                                 "the draft (taken between rounds)")


def online_flags(args) -> dict:
    """`StreamConfig.online` of the parsed flags (``lr`` and ``background`` where the
    command has them)."""
    out = {"mode": args.mode, "batch_size": args.batch_size, "epochs": args.epochs,
           "update_every": args.update_every, "precondition": args.precondition}
    if hasattr(args, "lr"):
        out["lr"] = args.lr
    out["background"] = bool(getattr(args, "background", False))
    if getattr(args, "publish_every", 1) != 1:
        out["publish_every"] = int(args.publish_every)
    # left out at their defaults, so results folders written before the flags resume
    if getattr(args, "ensemble_losses", "exact") != "exact":
        out["ensemble_losses"] = args.ensemble_losses
    if getattr(args, "stacked_oracle", False):
        out["stacked_oracle"] = True
    return out
