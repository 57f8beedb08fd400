#!/usr/bin/env bash
# pgo.sh: a CPU profile of the gateway at saturation, for profile-guided optimisation (PGO,
# https://go.dev/doc/pgo). The set-up is the proxy benchmark's (kvbench overhead): the binary built
# *without* PGO, one rr rule over `kvbench upstream -n 4`, wrk -t2 -c32 with the small completion
# request, the profile taken from the admin listener's /debug/pprof/profile while wrk runs.
# The project ships no cmd/gateway/default.pgo: on this benchmark a PGO build did not pay (within
# ±2 % of CPU per request, docs/benchmarks/proxy.md, 2026-12-01) and it compiles the gateway
# packages a second time (≈ 250 s of CPU here). To try one:
#   scripts/pgo.sh && go build -pgo=.cache/pgo/gateway.pgo -o gw-pgo ./cmd/gateway
# (copied to cmd/gateway/default.pgo instead, every build of cmd/gateway — go build, go test of
# the package, kvbench's fallback build, the container images — would use it).
#   PGO_SECONDS=30   length of the profile (wrk runs 2 s longer)
#   PGO_OUT=.cache/pgo/gateway.pgo
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
secs=${PGO_SECONDS:-30}
out=${PGO_OUT:-.cache/pgo/gateway.pgo}
mkdir -p "$(dirname "$out")"
command -v wrk >/dev/null || { echo "pgo.sh: wrk not found (apt-get install -y wrk)" >&2; exit 1; }
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
# -pgo=off: the profile is of the code as built without PGO (a default.pgo present would apply).
go build -pgo=off -o "$dir/gateway" ./cmd/gateway
go build -o "$dir/kvbench" ./cmd/kvbench
mkfifo "$dir/up.in"
"$dir/kvbench" upstream -n 4 <"$dir/up.in" >"$dir/up.out" &
pids+=($!)
exec 3>"$dir/up.in" # the upstream runs while this descriptor is open
for _ in $(seq 100); do [ -s "$dir/up.out" ] && break; sleep 0.1; done
read -r -a ups <"$dir/up.out"
[ "${#ups[@]}" -gt 0 ] || { echo "pgo.sh: the upstream printed no address" >&2; exit 1; }
{
  printf 'listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n  token: pgo\nrules:\n'
  printf '  - name: rr\n    models: [llama3]\n    engine: {family: vllm, release: v0.25.1}\n    selector: rr\n    endpoints:\n'
  i=0
  for a in "${ups[@]}"; do printf '      - {name: u%d, address: "http://%s"}\n' "$i" "$a"; i=$((i + 1)); done
} >"$dir/gateway.yaml"
"$dir/gateway" --config "$dir/gateway.yaml" --probe-interval 0 --reprobe-interval 0 --log-level error >"$dir/gw.out" &
pids+=($!)
for _ in $(seq 300); do grep -q '^gateway ready ' "$dir/gw.out" 2>/dev/null && break; sleep 0.1; done
line=$(grep -m1 '^gateway ready ' "$dir/gw.out") || { echo "pgo.sh: the gateway did not start" >&2; exit 1; }
admin=$(sed -E 's/.*admin=([^ ]+).*/\1/' <<<"$line")
listen=$(sed -E 's/.*listeners=([^ ,]+).*/\1/' <<<"$line")
cat >"$dir/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"llama3","prompt":"Say hello.","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
EOF
wrk -t2 -c32 -d1s -s "$dir/post.lua" "http://$listen/v1/completions" >/dev/null # warm-up
wrk -t2 -c32 -d$((secs + 2))s -s "$dir/post.lua" "http://$listen/v1/completions" >"$dir/wrk.out" &
pids+=($!)
sleep 1
curl -sf -H 'Authorization: Bearer pgo' -o "$dir/cpu.pprof" "http://$admin/debug/pprof/profile?seconds=$secs"
wait "${pids[-1]}"
grep -E 'Requests/sec|Non-2xx|Socket errors' "$dir/wrk.out" >&2 || true
cp "$dir/cpu.pprof" "$out"
echo "pgo.sh: wrote $out ($(wc -c <"$out") bytes, ${secs} s at saturation, load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
