#!/usr/bin/env bash
# gateway-ab.sh A B [rounds] [seconds]: two gateway builds (or wrappers that set environment
# variables and exec one) measured *at the same time*, each behind its own wrk -t1 -c16 against the
# same `kvbench upstream -n 4`, with the proxy benchmark's rr rule. On a machine shared with other
# work, alternated runs (kvbench overhead --baseline) move by ±30 % between neighbouring seconds;
# concurrent runs see the same load at every instant, so the per-round ratio B/A of requests/s and
# of CPU µs per request (utime + stime from /proc over the run ÷ requests) compares the two builds'
# efficiency, not the machine's mood. Neither figure is nginx's ratio: kvbench overhead gives that.
# Output: one line per round, then the medians and each gateway's peak RSS. Needs wrk, curl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
[ $# -ge 2 ] || { echo "usage: $0 GATEWAY_A GATEWAY_B [rounds] [seconds]" >&2; exit 2; }
a=$(realpath "$1") b=$(realpath "$2") rounds=${3:-10} secs=${4:-3}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
go build -o "$dir/kvbench" ./cmd/kvbench
mkfifo "$dir/up.in"
"$dir/kvbench" upstream -n 4 <"$dir/up.in" >"$dir/up.out" &
pids+=($!)
exec 3>"$dir/up.in" # the upstream runs while this descriptor is open
for _ in $(seq 100); do [ -s "$dir/up.out" ] && break; sleep 0.1; done
read -r -a ups <"$dir/up.out"
{
  printf 'listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n  token: ab\nrules:\n'
  printf '  - name: rr\n    models: [llama3]\n    engine: {family: vllm, release: v0.25.1}\n    selector: rr\n    endpoints:\n'
  i=0
  for u in "${ups[@]}"; do printf '      - {name: u%d, address: "http://%s"}\n' "$i" "$u"; i=$((i + 1)); done
} >"$dir/gateway.yaml"
declare -A pid url
for v in a b; do
  bin=$a
  [ "$v" = b ] && bin=$b
  "$bin" --config "$dir/gateway.yaml" --probe-interval 0 --reprobe-interval 0 --log-level error >"$dir/$v.out" &
  pid[$v]=$!
  pids+=($!)
done
for v in a b; do
  for _ in $(seq 300); do grep -q '^gateway ready ' "$dir/$v.out" 2>/dev/null && break; sleep 0.1; done
  line=$(grep -m1 '^gateway ready ' "$dir/$v.out") || { echo "gateway-ab.sh: gateway $v did not start" >&2; exit 1; }
  url[$v]="http://$(sed -E 's/.*listeners=([^ ,]+).*/\1/' <<<"$line")/v1/completions"
done
cat >"$dir/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"llama3","prompt":"Say hello.","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
EOF
# CPU ticks (utime + stime) of a process, from /proc/PID/stat (fields 14 and 15 after the name).
ticks() { sed -E 's/^.*\) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
hz=$(getconf CLK_TCK)
for v in a b; do wrk -t1 -c16 -d1s -s "$dir/post.lua" "${url[$v]}" >/dev/null; done # warm-up
echo "A=$a B=$b; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  ta0=$(ticks "${pid[a]}") tb0=$(ticks "${pid[b]}")
  wrk -t1 -c16 -d"${secs}s" -s "$dir/post.lua" "${url[a]}" >"$dir/wa" &
  wa=$!
  wrk -t1 -c16 -d"${secs}s" -s "$dir/post.lua" "${url[b]}" >"$dir/wb" &
  wb=$!
  wait $wa $wb
  ta1=$(ticks "${pid[a]}") tb1=$(ticks "${pid[b]}")
  for f in wa wb; do
    if grep -qE 'Non-2xx|Socket errors' "$dir/$f"; then echo "gateway-ab.sh: round $r: wrk reported errors:" >&2; cat "$dir/$f" >&2; exit 1; fi
  done
  na=$(awk '/requests in/{print $1}' "$dir/wa") nb=$(awk '/requests in/{print $1}' "$dir/wb")
  echo "$r $na $((ta1 - ta0)) $nb $((tb1 - tb0))"
done | python3 -c '
import sys, statistics as st
hz, secs = float(sys.argv[1]), float(sys.argv[2])
rr, rc = [], []
for line in sys.stdin:
    if line.startswith("A="):
        print(line, end=""); continue
    r, na, ta, nb, tb = line.split()
    na, nb = int(na), int(nb)
    ca, cb = int(ta) / hz * 1e6 / na, int(tb) / hz * 1e6 / nb
    rr.append(nb / na); rc.append(cb / ca)
    print(f"round {r}: A {na/secs:7.0f} req/s {ca:6.1f} CPU µs/req   B {nb/secs:7.0f} req/s {cb:6.1f} CPU µs/req   B/A req/s {nb/na:.3f} CPU {cb/ca:.3f}")
print(f"median B/A: req/s {st.median(rr):.3f}, CPU µs per request {st.median(rc):.3f} over {len(rr)} rounds")
' "$hz" "$secs"
hwm() { awk '/^VmHWM/{printf "%.1f MB", $2 / 1024}' "/proc/$1/status"; }
echo "peak RSS (VmHWM): A $(hwm "${pid[a]}"), B $(hwm "${pid[b]}"); load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
