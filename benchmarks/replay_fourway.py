"""What gradient adaptation adds over free adaptation: frozen head, online head, frozen
head + suffix tree, online head + suffix tree, replayed over the same (sub-)stream.

Reads the per-round records of ``specloop stream scale`` runs (one or more ``--out``
folders of the same recording and sub-stream: a resumed grid, or the ``+suffix`` rows
run beside the plain ones) and writes, per method, tau (overall and per domain) and
priced throughput, and the paired comparisons the question needs, each with its
95 % interval over prompts (`specloop.stats.paired_gain` for tau; the geometric mean
of per-prompt tokens/s ratios with a Student-t interval for throughput):

* online over frozen (without the suffix tree), and with the suffix tree beside both;
* the suffix tree's own gain for the frozen and for the online head;
* online + suffix against the frozen head alone (everything together);

and, per online comparison, the serial speedup `specloop.theory.online_cost` predicts
from the measured seconds a round and tau gain beside the one the replay priced (the
model takes the frozen run's drafting seconds for both; the difference is the online
draft's own drafting time).

Throughput is priced as in the replay: verification from the recording's cost table,
drafting as measured; "background" leaves the updates out (a worker off the decoder's
path), "serial" adds them to the decoder's time. Speedups divide by the greedy
baseline's priced tokens/s of the same folder.

    python benchmarks/replay_fourway.py --scale-out OUT_A --scale-out OUT_B --protocol in-domain \\
        --head hydra --learner opt --out benchmarks/results/replay_fourway_hydra.json

Exit 2 on bad input (a method missing, runs of different streams).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _job_folders(outs: list[Path], protocol: str) -> dict[str, Path]:
    """method -> its records folder (seed 0, no learning-rate job) over the outs."""
    found: dict[str, Path] = {}
    for out in outs:
        for rounds in sorted((out / protocol).glob("*-s0/*/rounds.jsonl")):
            found.setdefault(rounds.parent.name, rounds.parent)
        for rounds in sorted((out / "baseline").glob("*/greedy/rounds.jsonl")):
            found.setdefault("greedy", rounds.parent)
    return found


def _per_prompt(folder: Path) -> dict[int, dict]:
    """prompt index -> rounds, tokens, decode seconds (draft + priced verify), update seconds."""
    from specloop.record import Trace
    rows: dict[int, dict] = {}
    for r in Trace.load(folder / "rounds.jsonl"):
        row = rows.setdefault(int(r.stream_index), {"rounds": 0, "tokens": 0, "decode": 0.0, "update": 0.0,
                                                    "verify": 0.0, "draft": 0.0})
        row["rounds"] += 1
        row["tokens"] += int(r.tokens_per_round)
        row["decode"] += float(r.draft_time) + float(r.verify_time)
        row["verify"] += float(r.verify_time)
        row["draft"] += float(r.draft_time)
        row["update"] += float(r.update_time)
    return rows


def _stream_hash(folder: Path) -> str:
    from specloop.realmodels.online.checkpoint import load_checkpoint
    return str(load_checkpoint(folder / "state.pt").get("stream_hash"))


def _ratio_interval(log_ratios: list[float]) -> dict:
    from specloop.stats import log_ratio_t_interval
    mean, half = log_ratio_t_interval(log_ratios)
    return {"ratio": math.exp(mean), "ratio_ci": [math.exp(mean - half), math.exp(mean + half)],
            "n": len(log_ratios)}


def compare(a: dict[int, dict], b: dict[int, dict], domains: list[str]) -> dict:
    """``b`` against ``a`` on their shared prompts: tau (`paired_gain`, overall and per
    domain) and tokens/s ratios (background: decode time; serial: decode + updates)."""
    from specloop.stats import paired_gain
    shared = sorted(set(a) & set(b))
    counts = (lambda rows, keep: [{"index": i, "rounds": rows[i]["rounds"], "tokens": rows[i]["tokens"]}
                                  for i in keep])
    out = {"tau": paired_gain(counts(a, shared), counts(b, shared)),
           "tau_per_domain": {d: paired_gain(counts(a, [i for i in shared if domains[i] == d]),
                                             counts(b, [i for i in shared if domains[i] == d]))
                              for d in dict.fromkeys(domains[i] for i in shared)}}
    for name, cost in (("background", lambda r: r["decode"]), ("serial", lambda r: r["decode"] + r["update"])):
        logs = [math.log((b[i]["tokens"] / cost(b[i])) / (a[i]["tokens"] / cost(a[i]))) for i in shared]
        out[f"tokens_per_s_{name}"] = _ratio_interval(logs)
    return out


def cost_model_check(frozen: dict[int, dict], online: dict[int, dict]) -> dict:
    """`specloop.theory.online_cost.serial_speedup` from the frozen run's verify and
    draft seconds a round, the online run's update seconds a round and its pooled tau
    gain, beside the pooled serial tokens/s ratio the replay priced."""
    from specloop.theory.online_cost import serial_speedup
    total = (lambda rows, key: sum(r[key] for r in rows.values()))
    v = total(frozen, "verify") / total(frozen, "rounds")
    d = total(frozen, "draft") / total(frozen, "rounds")
    u = total(online, "update") / total(online, "rounds")
    gain = (total(online, "tokens") / total(online, "rounds")) / (total(frozen, "tokens") / total(frozen, "rounds")) - 1
    measured = (total(online, "tokens") / (total(online, "decode") + total(online, "update"))) / \
        (total(frozen, "tokens") / total(frozen, "decode"))
    return {"verify_seconds_per_round": v, "draft_seconds_per_round": d,
            "online_draft_seconds_per_round": total(online, "draft") / total(online, "rounds"),
            "update_seconds_per_round": u, "gain": gain, "predicted_serial": serial_speedup(v, d, u, gain),
            "measured_serial": measured}


def method_row(rows: dict[int, dict], domains: list[str], baseline_tps: float) -> dict:
    tokens = sum(r["tokens"] for r in rows.values())
    rounds = sum(r["rounds"] for r in rows.values())
    decode = sum(r["decode"] for r in rows.values())
    update = sum(r["update"] for r in rows.values())
    per_domain = {}
    for d in dict.fromkeys(domains[i] for i in rows):
        keep = [r for i, r in rows.items() if domains[i] == d]
        per_domain[d] = sum(r["tokens"] for r in keep) / sum(r["rounds"] for r in keep)
    return {"prompts": len(rows), "tau": tokens / rounds, "tau_per_domain": per_domain,
            "update_seconds": update, "decode_seconds": decode,
            "tokens_per_s_background": tokens / decode, "tokens_per_s_serial": tokens / (decode + update),
            "speedup_background": tokens / decode / baseline_tps,
            "speedup_serial": tokens / (decode + update) / baseline_tps}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale-out", action="append", required=True, type=Path,
                        help="a 'stream scale --out' folder (repeatable)")
    parser.add_argument("--protocol", default="in-domain")
    parser.add_argument("--head", default="hydra", help="the draft kind (hydra, eagle3, ...)")
    parser.add_argument("--learner", default="opt", help="the online prefix (opt, ens, ogd, osd, optens)")
    parser.add_argument("--recording", type=Path, required=True, help="the recording the runs replayed")
    parser.add_argument("--every", type=int, default=1, help="the runs' --every")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from specloop.realmodels.recording import open_recording, recorded_items
    names = {"frozen": args.head, "online": f"{args.learner}-{args.head}",
             "frozen+suffix": f"{args.head}+suffix", "online+suffix": f"{args.learner}-{args.head}+suffix"}
    folders = _job_folders(args.scale_out, args.protocol)
    missing = [m for m in [*names.values(), "greedy"] if m not in folders]
    if missing:
        print(f"error: no records of {', '.join(missing)} under {', '.join(map(str, args.scale_out))}",
              file=sys.stderr)
        return 2
    hashes = {m: _stream_hash(folders[m]) for m in names.values()}
    if len(set(hashes.values())) != 1:
        print(f"error: the runs served different streams: {hashes}", file=sys.stderr)
        return 2
    items = recorded_items(open_recording(args.recording), None, args.every)
    domains = [str(item.dataset) for item in items]
    rows = {role: _per_prompt(folders[m]) for role, m in names.items()}
    base = _per_prompt(folders["greedy"])
    baseline_tps = sum(r["tokens"] for r in base.values()) / sum(r["decode"] for r in base.values())
    pairs = {"online vs frozen": ("frozen", "online"),
             "online+suffix vs frozen+suffix": ("frozen+suffix", "online+suffix"),
             "frozen+suffix vs frozen": ("frozen", "frozen+suffix"),
             "online+suffix vs online": ("online", "online+suffix"),
             "online+suffix vs frozen": ("frozen", "online+suffix")}
    result = {"protocol": args.protocol, "recording": str(args.recording), "every": args.every,
              "methods": {role: {"method": names[role], **method_row(rows[role], domains, baseline_tps)}
                          for role in names},
              "baseline_tokens_per_s": baseline_tps,
              "comparisons": {k: compare(rows[a], rows[b], domains) for k, (a, b) in pairs.items()},
              "cost_model": {k: cost_model_check(rows[a], rows[b]) for k, (a, b) in pairs.items()
                             if k in ("online vs frozen", "online+suffix vs frozen+suffix")}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n", encoding="utf-8")
    for role, row in result["methods"].items():
        print(f"{row['method']:>20}  tau {row['tau']:.3f}  speedup bg {row['speedup_background']:.3f}  "
              f"serial {row['speedup_serial']:.3f}  ({row['prompts']} prompts)")
    for name, c in result["comparisons"].items():
        g = c["tau"]
        print(f"{name:>32}: tau {g['gain']:+.1%} [{g['gain_ci'][0]:+.1%}, {g['gain_ci'][1]:+.1%}]  "
              f"tokens/s bg {c['tokens_per_s_background']['ratio']:.3f}  serial {c['tokens_per_s_serial']['ratio']:.3f}")
    for name, c in result["cost_model"].items():
        print(f"{name:>32}: serial predicted {c['predicted_serial']:.3f}, priced {c['measured_serial']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
