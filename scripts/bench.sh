#!/usr/bin/env bash
# make bench: runs every Go benchmark on one core and the baselines measured beside them, writing
# raw output to .cache/bench/. The figures quoted in docs/BENCHMARKS.md come from these runs; each
# section there names the exact command. (kvbench's end-to-end report is issue 9.)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/bench
mkdir -p "$out"
echo "cores: $(nproc)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" | tee "$out/machine.txt"
go version | tee -a "$out/machine.txt"
benchtime=${BENCHTIME:-1s}
for pkg in ./gateway/hashcore ./gateway/inventory ./gateway/tokenize ./gateway/ingest ./gateway/route ./gateway/proxy ./engines/vllm ./engines/sglang ./engines/trtllm; do
  name=$(echo "$pkg" | tr '/.' '__')
  if go test -list 'Benchmark.*' "$pkg" 2>/dev/null | grep -q '^Benchmark'; then
    echo "== $pkg"
    go test -run '^$' -bench . -benchmem -cpu 1 -benchtime "$benchtime" "$pkg" | tee "$out/$name.txt"
  fi
done
if [ -x scripts/bench-hf-tokenizers.sh ]; then
  scripts/bench-hf-tokenizers.sh | tee "$out/hf-tokenizers.txt" || echo "HuggingFace baseline skipped (see above)"
fi
echo "raw results in $out/"
