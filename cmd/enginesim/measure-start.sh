#!/bin/bash
# Starts 8 enginesim processes one after another, times each to its "listening" line, reports RSS,
# then stops them by PID. Figures go to docs/benchmarks/simulator.md. Run from the repository root.
set -u
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/enginesim" ./cmd/enginesim || exit 1
fams=(vllm:v0.25.1 vllm:v0.23.0 sglang:v0.5.18 trtllm:1.2 llamacpp:b10573 vllm:v0.25.1 sglang:v0.5.18 trtllm:1.2)
pids=()
t0=$(date +%s%N)
for i in "${!fams[@]}"; do
  f=${fams[$i]%%:*}; r=${fams[$i]#*:}
  s=$(date +%s%N)
  PYTHONHASHSEED=0 "$tmp/enginesim" --family "$f" --release "$r" --model llama3 --endpoint "sim$i" \
    --http 127.0.0.1:0 --zmq 'tcp://*:0' --replay 'tcp://*:0' --log-level warn > "$tmp/o$i.txt" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 1000); do grep -q listening "$tmp/o$i.txt" && break; sleep 0.01; done
  echo "sim$i $f $r ready_ms=$(( ($(date +%s%N)-s)/1000000 ))"
done
echo "all 8 ready in $(( ($(date +%s%N)-t0)/1000000 )) ms (sequential)"
tot=0
for p in "${pids[@]}"; do r=$(awk '/VmRSS/{print $2}' "/proc/$p/status"); tot=$((tot+r)); echo "pid $p rss_kb=$r"; done
echo "total_rss_mb=$((tot/1024))"
for p in "${pids[@]}"; do kill -TERM "$p"; done
wait
