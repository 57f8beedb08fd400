#!/usr/bin/env bash
# hf-tokenizers.sh — build github.com/daulet/tokenizers' Rust library (libtokenizers.a: HuggingFace's
# tokenizers crate behind a C ABI) into .cache/hf-tokenizers, for the `hftokenizers` build tag of
# gateway/tokenize's differential test. The crate is taken from the Go module cache (go mod download)
# and built with cargo from crates.io. Its manifest names tiktoken-rs from a git branch, which cannot
# be fetched here: the patch below uses the nearest crates.io release the index serves (0.11.0; 0.8.0 is not served) instead
# (only the tiktoken constructor and decoder, unused by the differential, depend on it; two call
# sites are adapted to its slice API).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
out="$repo/.cache/hf-tokenizers"
ver="$(cd "$repo" && go list -m -f '{{.Version}}' github.com/daulet/tokenizers 2>/dev/null || echo v1.24.0)"
[ -f "$out/$ver/libtokenizers.a" ] && exit 0
src="$(cd "$repo" && go mod download -json "github.com/daulet/tokenizers@$ver" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
build="$out/build-$ver"
rm -rf "$build/src" && mkdir -p "$build" && cp -r "$src"/Cargo.toml "$src"/Cargo.lock "$src"/src "$src"/benches "$build"/ && chmod -R u+w "$build"
sed -i 's|^tiktoken-rs = { git = .*|tiktoken-rs = "0.11.0"|' "$build/Cargo.toml"
# tiktoken-rs 0.11's CoreBPE::decode takes a slice (the branch took a Vec): two call sites.
sed -i 's|bpe.decode(tokens_to_decode.clone())|bpe.decode(\&tokens_to_decode)|; s|bpe.decode(tokens_to_decode\[..valid_prefix_len\].to_vec())|bpe.decode(\&tokens_to_decode[..valid_prefix_len])|' "$build/src/lib.rs"
(cd "$build" && cargo build --release --quiet -j "${HF_TOKENIZERS_JOBS:-2}")
mkdir -p "$out/$ver" && cp "$build/target/release/libtokenizers.a" "$out/$ver/"
echo "hf-tokenizers: $out/$ver/libtokenizers.a"
