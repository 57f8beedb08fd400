#!/usr/bin/env bash
# scripts/bench-vllm.sh: the routing benchmark on real vLLM engines (docs/BENCHMARKS.md, "Routing
# on real vLLM"): three engines of the pinned CPU build (cmd/vllmpool; tiny llama3, dummy weights,
# PYTHONHASHSEED=0, 96 KV blocks each, so the six shared prefixes do not all fit on one engine),
# certified by ctk, one gateway listener per policy (round robin, least load, KV-exact with the
# default hard law, KV-exact with the ttft law, KV-exact with loadLaw.missPlacement headroom, KV-exact with
# loadLaw.missPlacement fewest-blocks) and two peer strategies deciding in the client
# (kvbench drive --peer), each run on the same seeded shared-prefix workload with the caches reset
# before it, every policy once a round in an order rotated each round. Prints the machine load
# before, at each round and after. BENCH_REQUESTS (default 60), BENCH_CONCURRENCY (default 2) and
# BENCH_ROUNDS (default 3) size the run, BENCH_ENGINE_TIMEOUT (default 15m) bounds the engines' start; BENCH_OUT, when set, names a folder that keeps every
# request's record (with the gateway's decision header), the gateway's log, /admin/status and
# its metrics after the run. The real engines hold the machine-wide engine lock while they run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
MODEL=llama3
GW_PID=
LOCK=$PWD/.cache/py/.engines.lock
if [ -z "${BENCH_VLLM_LOCKED:-}" ]; then
  echo "bench-vllm: waiting for the engine lock ($LOCK)"
  exec env BENCH_VLLM_LOCKED=1 flock "$LOCK" "$PWD/scripts/$(basename "$0")" "$@"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvexact-bench-vllm.XXXXXX")
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
RR=$((BASE + 5)) LL=$((BASE + 6)) KV=$((BASE + 7)) ADMIN=$((BASE + 8)) TT=$((BASE + 9)) HR=$((BASE + 10)) FB=$((BASE + 11))
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
"$BIN/vllmpool" up -dir "$WORK/pool" -n 3 -seeds 0 -kv-blocks 96 -binding engine -port "$BASE" -timeout "${BENCH_ENGINE_TIMEOUT:-15m}"
"$BIN/ctk" certify --pool "$WORK/pool/pool.yaml" --out "$WORK/cert" >"$WORK/certify.out" 2>&1 || {
  echo "bench-vllm: the pool is not certified" >&2; cat "$WORK/certify.out" >&2; exit 1; }
python3 - "$WORK/pool/engines.json" "$WORK/gateway.yaml" "$MODEL" "$RR" "$LL" "$KV" "$ADMIN" "$WORK/pool" "$TT" "$HR" "$FB" <<'EOF'
import json, sys
engines, out, model, rr, ll, kv, admin, root, tt, hr, fb = sys.argv[1:]
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
  - name: kv-exact-ttft
    listener: 127.0.0.1:{tt}
{common}    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: least-load
    loadLaw: {{kind: ttft}}
    endpoints:
{eps(True)}
  - name: kv-exact-headroom
    listener: 127.0.0.1:{hr}
{common}    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: least-load
    loadLaw: {{missPlacement: headroom}}
    endpoints:
{eps(True)}
  - name: kv-exact-fewest-blocks
    listener: 127.0.0.1:{fb}
{common}    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: least-load
    loadLaw: {{missPlacement: fewest-blocks}}
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
rc=0
"$BIN/kvbench" drive --model "$MODEL" --requests "${BENCH_REQUESTS:-60}" --prefixes 6 --concurrency "${BENCH_CONCURRENCY:-2}" \
  --rounds "${BENCH_ROUNDS:-3}" --record "$WORK/requests.jsonl" \
  --run "round-robin=http://127.0.0.1:$RR" --run "least-load=http://127.0.0.1:$LL" --run "kv-exact=http://127.0.0.1:$KV" \
  --run "kv-exact-ttft=http://127.0.0.1:$TT" --run "kv-exact-headroom=http://127.0.0.1:$HR" \
  --run "kv-exact-fewest-blocks=http://127.0.0.1:$FB" \
  --peer "dynamo-approx=dynamo-approx" --peer "sglang-tree=sglang-tree" \
  --block-size 32 --capacity-blocks 96 --max-num-seqs 16 "${args[@]}" || rc=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${BENCH_OUT:-}" ]; then
  mkdir -p "$BENCH_OUT"
  cp "$WORK/requests.jsonl" "$WORK/gateway.log" "$WORK/gateway.yaml" "$BENCH_OUT/"
  curl -sf -H "Authorization: Bearer bench-vllm" "http://127.0.0.1:$ADMIN/admin/status" >"$BENCH_OUT/status.json" || true
  curl -sf -H "Authorization: Bearer bench-vllm" "http://127.0.0.1:$ADMIN/metrics" >"$BENCH_OUT/metrics.txt" || true
  echo "bench-vllm: records in $BENCH_OUT"
fi
exit $rc
