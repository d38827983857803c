#!/usr/bin/env bash
# Sourced by the dev/*_device_run.sh scripts on the GPU machine, from the repository root:
#   unpack_devs                  unpacks every .devs/*.xz, replacing what a warm machine kept
#                                from an earlier call, and makes the binaries executable
#   ensure_big_model CLI LOG [T] [LAYERS]
#                                builds the demo tokenizer (/tmp/demo) and the 1.5B-shape
#                                checkpoint (/tmp/big, scripts/make_hf_fixtures.py --big, at most
#                                T seconds, default 240) unless /tmp/big is already there; with
#                                LAYERS, that many decoder layers in /tmp/big$LAYERS
#   start_model CLI [T] [LAYERS] ensure_big_model in the background (log $R/setup.log, its exit
#                                status appended there); wait_model waits for it and prints the
#                                log's last lines
#   build_trace_lib LOG          builds the CUPTI kernel tracer of dev/profile (kernel_trace.c)
#                                as /tmp/libkernel_trace.so, compiler output in LOG
#   model_and_tracer CLI [T]     start_model, build_trace_lib (log $R/trace-build.log), then
#                                wait_model: the 1.5B checkpoint and the tracer, both ready
#   profile_layers CLI DIR MODE [MODEL]
#                                the CUPTI table of CLI's decode step on MODEL (default the
#                                6-layer /tmp/big6; PROMPT_LEN as decode_profile.sh takes it,
#                                PROFILE_TIMEOUT seconds, default 60) in DIR
#                                (dev/profile/decode_profile.sh, the tracer built) and its
#                                per-layer and step lines; pack_traces DIR gzips DIR's traces
#   quant_args MODE              the `bench-generate` flags of a mode (w8a8, w8a8+head,
#                                fp8+codes, ...) as scripts/bench_e2e.sh reads it, one per line;
#                                dev/profile/decode_profile.sh reads its modes through it
#   begin_results                results in R=$OUT/r (tarred to $OUT/r.tgz on exit), .devs/
#                                unpacked, the build's commit and the device's name written there
#   bench_table JSONL            one line per case of a `cubellm bench` record: name, µs, GB/s
unpack_devs() {
  local f
  for f in .devs/*.xz; do
    [ -e "$f" ] && xz -dkf "$f"
  done
  chmod +x .devs/* 2>/dev/null
  return 0
}

ensure_big_model() {
  local cli=$1 log=$2 limit=${3:-240} layers=${4:-}
  local out=/tmp/big$layers
  [ -d "$out" ] && return 0
  timeout 120 "$cli" make-demo-model --out /tmp/demo > "$log" 2>&1
  timeout "$limit" python3 scripts/make_hf_fixtures.py --big ${layers:+--big-layers $layers} \
    --tokenizer /tmp/demo --out "$out" >> "$log" 2>&1
}

start_model() {
  (ensure_big_model "$1" "$R/setup.log" "${2:-240}" ${3:-}; echo "model rc=$?" >> "$R/setup.log") &
  MODEL_PID=$!
}

wait_model() {
  wait "$MODEL_PID"; tail -2 "$R/setup.log"
}

build_trace_lib() {
  local cu13
  cu13=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])')
  gcc -O2 -shared -fPIC -I"$cu13/include" \
    -I"$(dirname "$(dirname "$(command -v nvcc)")")/include" dev/profile/kernel_trace.c \
    -L"$cu13/lib" -l:libcupti.so.13 -o /tmp/libkernel_trace.so > "$1" 2>&1
}

model_and_tracer() {
  start_model "$1" "${2:-240}"
  build_trace_lib "$R/trace-build.log"
  wait_model
}

profile_layers() {
  TRACE_LIB=/tmp/libkernel_trace.so timeout "${PROFILE_TIMEOUT:-60}" \
    bash dev/profile/decode_profile.sh "$1" "${4:-/tmp/big6}" "$2" "$3" >> "$R/profile.out" 2>&1
  grep -h "^per layer\|^step" "$2/table_$3.md" 2>/dev/null
}

quant_args() {
  local mode=$1
  [ "${mode%%+*}" != none ] && printf '%s\n' --quant "${mode%%+*}"
  case "+$mode+" in *+head+*) printf '%s\n' --quant-lm-head ;; esac
  case "+$mode+" in *+float+*) printf '%s\n' --quant-decode float ;; esac
  case "+$mode+" in *+codes+*) printf '%s\n' --quant-decode codes ;; esac
  case "+$mode+" in *+float-simt+*) printf '%s\n' --quant-decode float-simt ;; esac
  return 0
}

pack_traces() {
  rm -f "$1"/copies_*.csv; gzip -f "$1"/trace_*.csv 2>/dev/null
  return 0
}

begin_results() {
  R=$OUT/r
  mkdir -p "$R"
  trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
  unpack_devs
  cp .devs/commit.txt "$R"/
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R"/device.txt
}

bench_table() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try: r = json.loads(line)
    except Exception: continue
    print("%-44s %8.2f us %7.1f GB/s" % (r["case"], r["us"], r["gbps"]))
' "$1"
}
