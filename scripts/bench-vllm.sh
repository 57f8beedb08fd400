#!/usr/bin/env bash
# scripts/bench-vllm.sh: the routing benchmark on real vLLM engines (docs/BENCHMARKS.md, "Routing
# on real vLLM"): three engines of the pinned CPU build (cmd/vllmpool; tiny llama3, dummy weights,
# PYTHONHASHSEED=0, 96 KV blocks each, so the six shared prefixes do not all fit on one engine),
# certified by ctk, one gateway listener per policy (round robin, least load, KV-exact) and two
# peer strategies deciding in the client (kvbench drive --peer), each run on the same seeded
# shared-prefix workload with the caches reset before it. Prints the machine load before and
# after. BENCH_REQUESTS (default 60) and BENCH_CONCURRENCY (default 2) size the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
MODEL=llama3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvexact-bench-vllm.XXXXXX")
GW_PID=
cleanup() {
  [ -n "$GW_PID" ] && { kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; }
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
RR=$((BASE + 5)) LL=$((BASE + 6)) KV=$((BASE + 7)) ADMIN=$((BASE + 8))
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
"$BIN/vllmpool" up -dir "$WORK/pool" -n 3 -seeds 0 -kv-blocks 96 -binding engine -port "$BASE"
"$BIN/ctk" certify --pool "$WORK/pool/pool.yaml" --out "$WORK/cert" >"$WORK/certify.out" 2>&1 || {
  echo "bench-vllm: the pool is not certified" >&2; cat "$WORK/certify.out" >&2; exit 1; }
python3 - "$WORK/pool/engines.json" "$WORK/gateway.yaml" "$MODEL" "$RR" "$LL" "$KV" "$ADMIN" "$WORK/pool" <<'EOF'
import json, sys
engines, out, model, rr, ll, kv, admin, root = sys.argv[1:]
es = json.load(open(engines))
def eps(events):
    lines = []
    for e in es:
        s = e["Spec"]
        lines.append(f'      - name: {e["Name"]}\n        address: "http://127.0.0.1:{s["Port"]}"')
        if events:
            lines.append(f'        events: {{zmq: ["tcp://127.0.0.1:{s["EventsPort"]}"], replay: ["tcp://127.0.0.1:{s["ReplayPort"]}"], topic: kv}}')
    return "\n".join(lines)
common = f'    models: [{model}]\n    engine: {{family: vllm, release: v0.31.0}}\n    blockSize: 32\n'
open(out, "w").write(f'''listen: 127.0.0.1:{rr}
admin: {{listen: "127.0.0.1:{admin}", token: "bench-vllm"}}
tokenizers: {{root: "{root}"}}
debugHeader: true
rules:
  - name: round-robin
{common}    selector: rr
    endpoints:
{eps(False)}
  - name: least-load
    listener: 127.0.0.1:{ll}
{common}    selector: least-load
    endpoints:
{eps(False)}
  - name: kv-exact
    listener: 127.0.0.1:{kv}
{common}    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: least-load
    endpoints:
{eps(True)}
''')
EOF
"$BIN/gateway" --config "$WORK/gateway.yaml" --certificate "$WORK/cert/certificate.json" \
  --reprobe-interval 0 --log-level warn >"$WORK/gateway.out" 2>"$WORK/gateway.log" &
GW_PID=$!
for _ in $(seq 1 600); do grep -q "gateway ready" "$WORK/gateway.out" 2>/dev/null && break; kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
grep -q "gateway ready" "$WORK/gateway.out" || { echo "bench-vllm: the gateway did not start" >&2; cat "$WORK/gateway.log" >&2; exit 1; }
args=()
for i in 0 1 2; do
  args+=(--clear "http://127.0.0.1:$((BASE + i))/reset_prefix_cache" --flush "http://127.0.0.1:$((BASE + i))" --engine "http://127.0.0.1:$((BASE + i))")
done
"$BIN/kvbench" drive --model "$MODEL" --requests "${BENCH_REQUESTS:-60}" --prefixes 6 --concurrency "${BENCH_CONCURRENCY:-2}" \
  --run "round-robin=http://127.0.0.1:$RR" --run "least-load=http://127.0.0.1:$LL" --run "kv-exact=http://127.0.0.1:$KV" \
  --peer "dynamo-approx=dynamo-approx" --peer "sglang-tree=sglang-tree" \
  --block-size 32 --capacity-blocks 96 --max-num-seqs 16 "${args[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
