#!/usr/bin/env bash
# make demo: the main job end to end on an embedded default.
#   1. four simulated vLLM v0.25.1 engines — E3 deliberately misconfigured (PYTHONHASHSEED=1, the
#      others 0), which would silently give a 0 % hit rate;
#   2. ctk certify catches it: the demo expects exit status 1 and shows the differing leg;
#   3. the gateway starts with the certificate: KV-exact runs on E0–E2 only, and says why not on E3;
#   4. the same shared-prefix workload runs through a round-robin listener and a KV-exact listener;
#   5. a table of what the engines' own receipts say: cached-token ratio and time to first token;
#   6. live: E1 restarts with PYTHONHASHSEED=1 on the same ports; the live parity watch fences it
#      within seconds, the status says why, and the KV-exact run is repeated without it.
# Everything runs on 127.0.0.1 and is cleaned up on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
MODEL=${DEMO_MODEL:-llama3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvexact-demo.XXXXXX")
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

free_port() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A block of 40 free ports below the kernel's ephemeral range (32768+), so that no outgoing
# connection can hold one: E_i http base+i, zmq base+10+i, replay base+20+i; gateway base+30..33.
for _ in $(seq 1 50); do
  BASE=$((12000 + RANDOM % 20000))
  ok=1
  for o in $(seq 0 39); do free_port $((BASE + o)) || { ok=0; break; }; done
  [ "$ok" = 1 ] && break
done

wait_line() { # file pattern seconds pid
  for _ in $(seq 1 $(( $3 * 10 ))); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    if [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1:" >&2; tail -20 "$1" >&2; return 1
}

step "1. Four simulated vLLM v0.25.1 engines ($MODEL, ${DEMO_CAPACITY:-320} KV blocks each); E3 runs with PYTHONHASHSEED=1, the others with 0"
for i in 0 1 2 3; do
  seed=0; [ "$i" = 3 ] && seed=1
  PYTHONHASHSEED=$seed "$BIN/enginesim" --family vllm --release v0.25.1 --model "$MODEL" --served-model-name "$MODEL" \
    --endpoint "E$i" --http "127.0.0.1:$((BASE + i))" --zmq "tcp://*:$((BASE + 10 + i))" --replay "tcp://*:$((BASE + 20 + i))" \
    --prefill-per-token 300us --decode-per-token 2ms --max-concurrency 4 --capacity "${DEMO_CAPACITY:-320}" \
    --log-level warn >"$WORK/E$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1 2 3; do wait_line "$WORK/E$i.log" "enginesim listening" 60 "${PIDS[$i]}"; echo "E$i listening on 127.0.0.1:$((BASE + i))"; done

endpoints() { # the four endpoints, as YAML list items (indent $1)
  for i in 0 1 2 3; do
    printf '%s- name: E%d\n%s  address: http://127.0.0.1:%d\n%s  events: {zmq: ["tcp://127.0.0.1:%d"], replay: ["tcp://127.0.0.1:%d"]}\n' \
      "$1" "$i" "$1" $((BASE + i)) "$1" $((BASE + 10 + i)) $((BASE + 20 + i))
  done
}

step "2. ctk certify: the staged profile (seed \"0\", sha256, block size 16) against every engine"
cat >"$WORK/pool.yaml" <<EOF
model: $MODEL
engine: {family: vllm, release: v0.25.1}
seed: "0"
binding: engine
endpoints:
$(endpoints "  ")
EOF
set +e
"$BIN/ctk" certify --pool "$WORK/pool.yaml" --out "$WORK/cert" >"$WORK/certify.out" 2>&1
status=$?
set -e
if [ "$status" != 1 ]; then
  echo "demo: ctk certify exited $status; expected 1 (the misconfigured E3 must be caught)" >&2
  cat "$WORK/certify.out" >&2
  exit 1
fi
echo "ctk certify exited 1, as expected. From the report:"
grep -E '^(FAIL)' "$WORK/cert/report.txt" | head -5 || true
grep -iE 'verdict|certified|not certified' "$WORK/cert/report.txt" | tail -4 || true

step "3. The gateway with the certificate: round robin on :$((BASE + 30)), KV-exact on :$((BASE + 31))"
TOKEN=demo-$RANDOM$RANDOM
cat >"$WORK/gateway.yaml" <<EOF
listen: 127.0.0.1:$((BASE + 30))
admin: {listen: "127.0.0.1:$((BASE + 32))", token: "$TOKEN"}
tokenizers: {root: "${KVEXACT_TOKENIZERS:-}"}
debugHeader: true
rules:
  - name: round-robin
    models: [$MODEL]
    engine: {family: vllm, release: v0.25.1}
    selector: rr
    endpoints:
$(for i in 0 1 2 3; do printf '      - {name: E%d, address: "http://127.0.0.1:%d"}\n' "$i" $((BASE + i)); done)
  - name: kv-exact
    listener: 127.0.0.1:$((BASE + 31))
    models: [$MODEL]
    engine: {family: vllm, release: v0.25.1}
    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: rr
    endpoints:
$(endpoints "      ")
EOF
"$BIN/gateway" --config "$WORK/gateway.yaml" --certificate "$WORK/cert/certificate.json" --reprobe-interval 0 --log-level warn \
  >"$WORK/gateway.out" 2>"$WORK/gateway.log" &
PIDS+=($!)
wait_line "$WORK/gateway.out" "gateway ready" 60 "${PIDS[4]}" || { cat "$WORK/gateway.log" >&2; exit 1; }
curl -fsS -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$((BASE + 32))/admin/status" >"$WORK/status.json"
# The kv-exact rule's verdict per endpoint, from the gateway's own status.
"$BIN/kvbench" status --file "$WORK/status.json" --rule kv-exact

step "4. The same shared-prefix workload through each listener (caches emptied before each run)"
clears=()
for i in 0 1 2 3; do clears+=(--clear "http://127.0.0.1:$((BASE + i))/sim/clear"); done
"$BIN/kvbench" drive --model "$MODEL" --requests "${DEMO_REQUESTS:-160}" --prefixes 16 --concurrency 4 \
  --run "round-robin=http://127.0.0.1:$((BASE + 30))" --run "kv-exact=http://127.0.0.1:$((BASE + 31))" "${clears[@]}"

step "5. Live: E1 restarts on the same ports with PYTHONHASHSEED=1; the gateway fences it by itself"
kill "${PIDS[1]}"; wait "${PIDS[1]}" 2>/dev/null || true
PYTHONHASHSEED=1 "$BIN/enginesim" --family vllm --release v0.25.1 --model "$MODEL" --served-model-name "$MODEL" \
  --endpoint E1 --http "127.0.0.1:$((BASE + 1))" --zmq "tcp://*:$((BASE + 11))" --replay "tcp://*:$((BASE + 21))" \
  --prefill-per-token 300us --decode-per-token 2ms --max-concurrency 4 --capacity "${DEMO_CAPACITY:-320}" \
  --log-level warn >"$WORK/E1-restarted.log" 2>&1 &
PIDS[1]=$!
wait_line "$WORK/E1-restarted.log" "enginesim listening" 60 "${PIDS[1]}"
start=$(date +%s%N)
fenced=0
for n in $(seq 1 100); do
  # Traffic that reaches E1 directly (another client): its stored-block events are what the live
  # parity watch re-hashes with the certified seed.
  curl -fsS -o /dev/null -H 'Content-Type: application/json' "http://127.0.0.1:$((BASE + 1))/v1/completions" \
    -d "{\"model\": \"$MODEL\", \"prompt\": \"After the restart, request $n: a prompt long enough to fill a few KV blocks of sixteen tokens each, so that its events carry token ids to check.\", \"max_tokens\": 1}" || true
  curl -fsS -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$((BASE + 32))/admin/status" >"$WORK/status.json"
  if grep -q '"parity_mismatch"' "$WORK/status.json"; then fenced=1; break; fi
  sleep 0.1
done
if [ "$fenced" != 1 ]; then
  echo "demo: the gateway did not fence the restarted E1" >&2; tail -20 "$WORK/gateway.log" >&2; exit 1
fi
printf 'E1 fenced %d ms after it came back (log: %s)\n' $(( ($(date +%s%N) - start) / 1000000 )) \
  "$(grep 'endpoint=E1' "$WORK/gateway.log" | grep -m1 'do not match' | sed 's/^time=[^ ]* //' | cut -c1-200)"
"$BIN/kvbench" status --file "$WORK/status.json" --rule kv-exact
"$BIN/kvbench" drive --model "$MODEL" --requests "${DEMO_REQUESTS:-160}" --prefixes 16 --concurrency 4 \
  --run "kv-exact-E1-fenced=http://127.0.0.1:$((BASE + 31))" "${clears[@]}"

step "Done"
echo "Cached-token ratio and TTFT come from the engines' own receipts (usage.prompt_tokens_details.cached_tokens,"
echo "X-Kvexact-Served-By); the gateway's receipt (X-Kvexact-Endpoint) agreed on every response."
