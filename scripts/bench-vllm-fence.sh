#!/usr/bin/env bash
# scripts/bench-vllm-fence.sh GATEWAY_A GATEWAY_B: two gateway binaries (e.g. before and after a
# change to the restart verification) alternated A, B, A, B on the same three real vLLM engines
# (cmd/vllmpool; tiny llama3, dummy weights, PYTHONHASHSEED=0, 96 KV blocks each), the default
# KV-exact rule alone, `kvbench drive --rounds 3` per gateway with every engine's cache reset
# before each run. The drive's decision summary names every endpoint KV-exact could not choose
# (docs/BENCHMARKS.md, 1b). BIN names the folder with vllmpool, ctk and kvbench. The real engines
# hold the machine-wide engine lock while they run.
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 GATEWAY_A GATEWAY_B" >&2; exit 2; }
A=$(realpath "$1") B=$(realpath "$2")
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
LOCK=$PWD/.cache/py/.engines.lock
if [ -z "${BENCH_VLLM_LOCKED:-}" ]; then
  echo "bench-vllm-fence: waiting for the engine lock ($LOCK)"
  exec env BENCH_VLLM_LOCKED=1 flock "$LOCK" "$PWD/scripts/$(basename "$0")" "$A" "$B"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvexact-bench-fence.XXXXXX")
GW=
cleanup() {
  [ -n "$GW" ] && { kill "$GW" 2>/dev/null || true; wait "$GW" 2>/dev/null || true; }
  [ -f "$WORK/pool/pids" ] && "$BIN/vllmpool" down -dir "$WORK/pool" || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
free_port() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 1 50); do
  BASE=$((12000 + RANDOM % 20000))
  ok=1
  for o in $(seq 0 12); do free_port $((BASE + o)) || { ok=0; break; }; done
  [ "$ok" = 1 ] && break
done
KV=$((BASE + 7)) ADMIN=$((BASE + 8))
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
"$BIN/vllmpool" up -dir "$WORK/pool" -n 3 -seeds 0 -kv-blocks 96 -binding engine -port "$BASE" -timeout "${BENCH_ENGINE_TIMEOUT:-15m}"
"$BIN/ctk" certify --pool "$WORK/pool/pool.yaml" --out "$WORK/cert" >"$WORK/certify.out" 2>&1 || {
  echo "bench-vllm-fence: the pool is not certified" >&2; cat "$WORK/certify.out" >&2; exit 1; }
python3 - "$WORK/pool/engines.json" "$WORK/gateway.yaml" "$KV" "$ADMIN" "$WORK/pool" <<'PY'
import json, sys
engines, out, kv, admin, root = sys.argv[1:]
eps = "\n".join(f'''      - name: {e["Name"]}
        address: "http://127.0.0.1:{e["Spec"]["Port"]}"
        events: {{zmq: ["tcp://127.0.0.1:{e["Spec"]["EventsPort"]}"], replay: ["tcp://127.0.0.1:{e["Spec"]["ReplayPort"]}"], topic: kv}}''' for e in json.load(open(engines)))
open(out, "w").write(f'''listen: 127.0.0.1:{kv}
admin: {{listen: "127.0.0.1:{admin}", token: "bench-fence"}}
tokenizers: {{root: "{root}"}}
debugHeader: true
rules:
  - name: kv-exact
    models: [llama3]
    engine: {{family: vllm, release: v0.31.0}}
    blockSize: 32
    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: least-load
    endpoints:
{eps}
''')
PY
args=()
for i in 0 1 2; do
  args+=(--clear "http://127.0.0.1:$((BASE + i))/reset_prefix_cache" --flush "http://127.0.0.1:$((BASE + i))")
done
for gw in "$A" "$B" "$A" "$B"; do
  "$gw" --config "$WORK/gateway.yaml" --certificate "$WORK/cert/certificate.json" \
    --reprobe-interval 0 --log-level warn >"$WORK/gateway.out" 2>"$WORK/gateway.log" &
  GW=$!
  for _ in $(seq 1 600); do grep -q "gateway ready" "$WORK/gateway.out" 2>/dev/null && break; kill -0 "$GW" 2>/dev/null || break; sleep 0.1; done
  grep -q "gateway ready" "$WORK/gateway.out" || { echo "bench-vllm-fence: $gw did not start" >&2; cat "$WORK/gateway.log" >&2; exit 1; }
  echo "=== $gw"
  "$BIN/kvbench" drive --model llama3 --requests "${BENCH_REQUESTS:-60}" --prefixes 6 --concurrency 2 --rounds 3 \
    --run "kv-exact=http://127.0.0.1:$KV" "${args[@]}"
  kill "$GW"; wait "$GW" 2>/dev/null || true; GW=
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
