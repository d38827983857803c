#!/usr/bin/env bash
# End-to-end decode and prefill on the GPU machine, ours beside the plain-PyTorch peer in the same
# call: for each context, `scripts/bench_torch_decode.py` (bf16, cuBLAS + SDPA, static KV cache,
# one CUDA graph per step) once, then `cubellm bench-generate` for each weight format, each
# appending one JSON line (device, date, commit, context, prefill and decode tok/s, the peer's
# line) to RECORD.
#
#   scripts/bench_e2e.sh CLI MODEL_DIR RECORD [CONTEXT...]      (default context: 512)
#
# CLI is a cubellm binary, MODEL_DIR a checkpoint (`scripts/make_hf_fixtures.py --big` builds the
# 1.5B shape). MODES ("none w8a8 fp8 w4a16"; a format with `+head`, e.g. `w4a16+head`, also
# quantizes the LM head: --quant-lm-head; the 8-bit formats decode as the CLI's default, on the
# float activation on the SIMT cores, and with `+codes`, e.g. `w8a8+codes`, on quantized
# activations: --quant-decode codes; `+float` asks for the float activation on f16 tensor cores:
# --quant-decode float, `+float-simt` for the default explicitly; `+screen`, e.g. `none+screen`,
# screens the float LM head with an int8 copy: --screen-lm-head), NEW_TOKENS (128) and
# RUNS (3) set the runs; the prompt is CONTEXT tokens, so the last decode step attends over
# CONTEXT + NEW_TOKENS - 1 keys.
set -euo pipefail
cli=$1 model=$2 record=$3
shift 3
contexts=${*:-512}
modes=${MODES:-none w8a8 fp8 w4a16}
new=${NEW_TOKENS:-128}
runs=${RUNS:-3}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ctx in $contexts; do
  peer="$tmp/peer_$ctx.json"
  python3 "$here/bench_torch_decode.py" --model "$model" --prompt-len "$ctx" \
    --new-tokens "$new" --runs "$runs" > "$peer"
  echo "peer, context $ctx: $(cat "$peer")" >&2
  for mode in $modes; do
    q=()
    base=${mode%%+*}
    [ "$base" != none ] && q=(--quant "$base")
    case "+$mode+" in *+head+*) q+=(--quant-lm-head) ;; esac
    case "+$mode+" in *+screen+*) q+=(--screen-lm-head) ;; esac
    case "+$mode+" in *+float+*) q+=(--quant-decode float) ;; esac
    case "+$mode+" in *+codes+*) q+=(--quant-decode codes) ;; esac
    case "+$mode+" in *+float-simt+*) q+=(--quant-decode float-simt) ;; esac
    "$cli" --runtime cuda bench-generate --model "$model" --prompt-len "$ctx" \
      --new-tokens "$new" --runs "$runs" "${q[@]}" --peer "$peer" --record "$record"
  done
done
