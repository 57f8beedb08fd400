#!/usr/bin/env bash
# make demo-vllm: make demo's steps on real vLLM engines (the pinned CPU build, .cache/py/vllm; a tiny
# llama3 with dummy weights; docs/vllm-engine.md):
#   1. three vLLM engines (cmd/vllmpool) — vllm-2 deliberately started with PYTHONHASHSEED=1, the
#      others with 0. Three because each engine is three Python processes, ≈ 2.6 GB and about one
#      core while it starts: three is what this 2-core machine carries with other work running;
#   2. ctk certify catches vllm-2: the demo expects exit status 1 and shows the seed leg;
#   3. the gateway starts with the certificate: KV-exact on vllm-0 and vllm-1 only;
#   4. the same shared-prefix workload through a round-robin and a KV-exact listener, the table from
#      the engines' own receipts, and "predicted = realized on N of M requests" for the KV-exact run
#      (the demo fails when they differ);
#   5. live: vllm-1 restarts with PYTHONHASHSEED=1 on the same ports; the gateway fences it.
# Everything runs on 127.0.0.1; the engines are stopped by their process-group ids on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
MODEL=llama3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvexact-demo-vllm.XXXXXX")
GW_PID=

cleanup() {
  [ -n "$GW_PID" ] && { kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; }
  [ -f "$WORK/pool/pids" ] && "$BIN/vllmpool" down -dir "$WORK/pool" || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
free_port() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 1 50); do
  BASE=$((12000 + RANDOM % 20000))
  ok=1
  for o in $(seq 0 9); do free_port $((BASE + o)) || { ok=0; break; }; done
  [ "$ok" = 1 ] && break
done
RR=$((BASE + 5)) KV=$((BASE + 6)) ADMIN=$((BASE + 7))

step "1. Three real vLLM engines ($MODEL, dummy weights); vllm-2 runs with PYTHONHASHSEED=1, the others with 0"
"$BIN/vllmpool" up -dir "$WORK/pool" -n 3 -seeds 0,0,1 -kv-blocks 0 -binding engine -port "$BASE"

step "2. ctk certify: the staged profile (seed \"0\", sha256, block size 32, engine binding) against every engine"
set +e
"$BIN/ctk" certify --pool "$WORK/pool/pool.yaml" --out "$WORK/cert" >"$WORK/certify.out" 2>&1
status=$?
set -e
if [ "$status" != 1 ]; then
  echo "demo-vllm: ctk certify exited $status; expected 1 (vllm-2's seed must be caught)" >&2
  cat "$WORK/certify.out" >&2
  exit 1
fi
echo "ctk certify exited 1, as expected. From the report:"
grep -E '^FAIL' "$WORK/cert/report.txt" | head -5 || true
grep -iE 'verdict|certified' "$WORK/cert/report.txt" | tail -4 || true

step "3. The gateway with the certificate: round robin on :$RR, KV-exact on :$KV"
TOKEN=demo-$RANDOM$RANDOM
python3 - "$WORK/pool/engines.json" "$WORK/gateway.yaml" "$MODEL" "$RR" "$KV" "$ADMIN" "$TOKEN" "$WORK/pool" <<'EOF'
import json, sys
engines, out, model, rr, kv, admin, token, root = sys.argv[1:]
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
admin: {{listen: "127.0.0.1:{admin}", token: "{token}"}}
tokenizers: {{root: "{root}"}}
debugHeader: true
rules:
  - name: round-robin
{common}    selector: rr
    endpoints:
{eps(False)}
  - name: kv-exact
    listener: 127.0.0.1:{kv}
{common}    kvExactMode: 3
    seed: "0"
    binding: engine
    predictOnRoute: off
    selector: rr
    endpoints:
{eps(True)}
''')
EOF
"$BIN/gateway" --config "$WORK/gateway.yaml" --certificate "$WORK/cert/certificate.json" \
  --reprobe-interval 0 --log-level warn >"$WORK/gateway.out" 2>"$WORK/gateway.log" &
GW_PID=$!
for _ in $(seq 1 600); do grep -q "gateway ready" "$WORK/gateway.out" 2>/dev/null && break; kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
grep -q "gateway ready" "$WORK/gateway.out" || { echo "demo-vllm: the gateway did not start" >&2; cat "$WORK/gateway.log" >&2; exit 1; }
curl -fsS -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$ADMIN/admin/status" >"$WORK/status.json"
"$BIN/kvbench" status --file "$WORK/status.json" --rule kv-exact

clears=()
# vLLM announces a reset only when its next step ends: --flush runs that step before each run.
for i in 0 1 2; do clears+=(--clear "http://127.0.0.1:$((BASE + i))/reset_prefix_cache" --flush "http://127.0.0.1:$((BASE + i))"); done
step "4. The same shared-prefix workload through each listener (caches reset before each run)"
"$BIN/kvbench" drive --model "$MODEL" --requests "${DEMO_REQUESTS:-48}" --prefixes 6 --concurrency 2 --check-predicted 32 \
  --run "round-robin=http://127.0.0.1:$RR" --run "kv-exact=http://127.0.0.1:$KV" "${clears[@]}"

step "5. Live: vllm-1 restarts on the same ports with PYTHONHASHSEED=1; the gateway fences it by itself"
"$BIN/vllmpool" restart -dir "$WORK/pool" -name vllm-1 -seed 1
start=$(date +%s)
fenced=0
for n in $(seq 1 120); do
  # Traffic that reaches vllm-1 directly (another client): its stored-block events are what the
  # live parity watch re-hashes with the certified seed.
  curl -fsS -o /dev/null -H 'Content-Type: application/json' "http://127.0.0.1:$((BASE + 1))/v1/completions" \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"After the restart, request $n: a prompt long enough to fill a few KV blocks of thirty-two tokens each, so that its events carry token ids for the gateway to check against the certified seed.\", \"max_tokens\": 1}" || true
  curl -fsS -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$ADMIN/admin/status" >"$WORK/status.json"
  if grep -q '"parity_mismatch"' "$WORK/status.json"; then fenced=1; break; fi
  sleep 0.5
done
if [ "$fenced" != 1 ]; then
  echo "demo-vllm: the gateway did not fence the restarted vllm-1" >&2; tail -20 "$WORK/gateway.log" >&2; exit 1
fi
echo "vllm-1 fenced $(( $(date +%s) - start )) s after it came back"
"$BIN/kvbench" status --file "$WORK/status.json" --rule kv-exact

step "Done"
echo "Cached tokens and TTFT come from the engines' own receipts (usage.prompt_tokens_details.cached_tokens);"
echo "the KV-exact predictions were checked against them request by request."
