#!/usr/bin/env bash
# GPU readiness check, for a CUDA machine; about 8 minutes at most.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]       # default: $OUT, else ./gpu_check_out
#
# 1. the lossless SmolLM2 tests with the target on CUDA (SPECLOOP_TEST_DEVICE=cuda):
#    EAGLE / Hydra / hedge+suffix / online EAGLE heads, greedy == plain greedy;
# 2. a real-model decode on CUDA (SmolLM2-135M, float32 and bfloat16, drafters ngram,
#    suffix, eagle, eagle3, medusa, hydra): tokens/s with synchronised timing and whether
#    the float32 greedy output equals plain greedy, as JSON (decode.json);
# 3. pytest's JUnit XML (lossless_tests.xml) and a summary (gpu_check.json).
# Without CUDA it exits 2 with a message. Exit 1 if a test fails or an output differs.
set -u
OUT_DIR="${1:-${OUT:-./gpu_check_out}}"
mkdir -p "$OUT_DIR"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check.sh: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
start=$(date +%s)
SPECLOOP_TEST_DEVICE=cuda timeout 300 python -m pytest -q -x \
    tests/realmodels/test_heads_eagle_smollm2.py tests/realmodels/test_heads_hydra_smollm2.py \
    tests/realmodels/test_hedge_suffix_smollm2.py tests/realmodels/test_online_eagle_smollm2.py \
    tests/realmodels/test_published_heads.py tests/integrations \
    --junitxml="$OUT_DIR/lossless_tests.xml" > "$OUT_DIR/lossless_tests.log" 2>&1
tests_rc=$?
tail -3 "$OUT_DIR/lossless_tests.log"
timeout 170 python - "$OUT_DIR/decode.json" <<'PY'
import json, sys, time
import torch
from specloop.realmodels.decoder import SpeculativeDecoder
from specloop.realmodels.registry.drafters import make_drafter
from specloop.realmodels.loading import load_model
from specloop.realmodels.policy import FixedDraftPolicy

PROMPTS = ["def quicksort(xs):\n    ", "Explain speculative decoding in one paragraph.", "import numpy as np\n\n"]
N = 64
rows, all_same = [], True
for dtype in ("float32", "bfloat16"):
    target = load_model("smollm2-135m", dtype=dtype, device="cuda")
    tok = target.tokenizer
    ids = [tok(p).input_ids for p in PROMPTS]
    plain = []
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for prompt in ids:
        out = target.model.generate(torch.tensor([prompt], device="cuda"), do_sample=False, max_new_tokens=N)
        plain.append(out[0, len(prompt):].tolist())
    torch.cuda.synchronize(); base = sum(map(len, plain)) / (time.perf_counter() - t0)
    rows.append({"dtype": dtype, "drafter": "hf-greedy", "tokens_per_s": base})
    for name in ("ngram", "suffix", "eagle", "eagle3", "medusa", "hydra"):
        try:
            drafter = make_drafter(name, target, dtype=dtype, train_if_missing=False, progress=False)
            decoder = SpeculativeDecoder(target, drafter, policy=FixedDraftPolicy(5))
            outs = []
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for prompt in ids:
                outs.append(decoder.generate(prompt, max_new_tokens=N).new_tokens)
            torch.cuda.synchronize(); secs = time.perf_counter() - t0
            # EOS can end a run earlier than HF's max_new_tokens: compare the common prefix length too
            same = all(o == p[:len(o)] for o, p in zip(outs, plain))
            row = {"dtype": dtype, "drafter": name, "tokens_per_s": sum(map(len, outs)) / secs,
                   "speedup": sum(map(len, outs)) / secs / base, "identical_to_greedy": same}
            if dtype == "float32":
                all_same &= same
        except Exception as exc:                       # record and go on: one broken drafter is a finding
            row = {"dtype": dtype, "drafter": name, "error": f"{type(exc).__name__}: {exc}"}
            all_same = False
        rows.append(row)
        print(row, flush=True)
json.dump({"device": torch.cuda.get_device_name(0), "max_new_tokens": N, "prompts": len(PROMPTS), "rows": rows,
           "float32_identical_to_greedy": all_same}, open(sys.argv[1], "w"), indent=1)
sys.exit(0 if all_same else 1)
PY
decode_rc=$?
python - "$OUT_DIR" "$tests_rc" "$decode_rc" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
out, tests_rc, decode_rc, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
json.dump({"lossless_tests_rc": tests_rc, "decode_rc": decode_rc, "seconds": secs}, open(f"{out}/gpu_check.json", "w"))
print(f"gpu_check: tests rc {tests_rc}, decode rc {decode_rc}, {secs} s; results in {out}")
PY
[ "$tests_rc" -eq 0 ] && [ "$decode_rc" -eq 0 ]
