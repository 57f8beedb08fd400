#!/usr/bin/env bash
# bench-tokenizer.sh — single-core encode speed of gateway/tokenize next to HuggingFace tokenizers
# (npm tokenizers@0.23.2, Rust through N-API), measured in the same run on the same core:
# HF, then Go, then HF again. Figures go to docs/benchmarks/tokenizer.md by hand.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
dir=""; for r in ${KVEXACT_TOKENIZERS:-} "$repo/../shared/tokenizers" "$repo/.cache/tokenizers"; do [ -f "$r/llama3/tokenizer.json" ] && { dir="$r/llama3"; break; }; done
core="${BENCH_CORE:-0}"
if [ ! -d .cache/node/node_modules/tokenizers ]; then
	if command -v npm >/dev/null; then
		npm install --silent --prefix .cache/node tokenizers@0.23.2
	else
		echo "bench-tokenizer: npm missing: no HuggingFace baseline (apt-get install npm)" >&2
	fi
fi
echo "# nproc=$(nproc) core=$core model dir=$dir"
hf() {
	[ -d .cache/node/node_modules/tokenizers ] || return 0
	RAYON_NUM_THREADS=1 UV_THREADPOOL_SIZE=1 taskset -c "$core" node bench/hf-encode.js "$dir" "${HF_ROUNDS:-9}"
}
hf
(cd gateway/tokenize && taskset -c "$core" go test -run XXX -bench 'BenchmarkEncode$/llama3' -benchtime "${BENCHTIME:-3s}" -cpu 1 -count "${COUNT:-3}" .) | grep -E '^Benchmark'
hf
