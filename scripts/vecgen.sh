#!/usr/bin/env bash
# vecgen.sh — regenerate the engine-truth vector files from the pinned releases' wheels (make vectors).
#
#   scripts/vecgen.sh          write vectors/vllm/v<release>/{sha256,sha256_cbor,xxhash,xxhash_cbor}.json
#                              and the project event-sample files (msgspec and the release's classes)
#   scripts/vecgen.sh check    also hash every pinned release (contracts/data) with its own wheel and
#                              fail when its values differ from its contract's vector folder
#   VECGEN_OUT=DIR             write under DIR instead of vectors/ (the regenerate-equals-committed test)
#
# The generator (scripts/vecgen/main.py) runs in .cache/py/vecgen (scripts/pyenv.sh vecgen) and imports
# each release's modules straight from its wheel in .cache/wheels (downloaded once, pip download
# --no-deps); cmd/vecgen -convert turns vLLM's case layout into the project's schema.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
"$repo/scripts/pyenv.sh" vecgen
py="$repo/.cache/py/vecgen/bin/python"
out="${VECGEN_OUT:-$repo/vectors}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" "$repo/scripts/vecgen/main.py" write "$tmp/orig"
cp -r "$tmp/orig" "$tmp/conv"
(cd "$repo" && go run ./cmd/vecgen -convert "$tmp"/conv/vllm/*/*.json)
for d in "$tmp"/conv/vllm/*/; do
	rel="$(basename "$d")"
	mkdir -p "$out/vllm/$rel"
	cp "$d"/*.json "$out/vllm/$rel/"
done
"$py" "$repo/scripts/vecgen/main.py" samples "$out"
if [ "${1:-}" = check ]; then
	VECGEN_ORIGINALS="$tmp/orig" "$py" "$repo/scripts/vecgen/main.py" check
fi
