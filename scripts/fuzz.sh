#!/usr/bin/env bash
# fuzz.sh DURATION — runs every fuzz target in the module for DURATION each (make fuzz: FUZZTIME,
# default 30s). Targets are discovered per package with `go test -list 'Fuzz.*'`; each runs alone
# (-fuzz '^Name$') on one worker, so a 2-core machine shared with others stays usable. New failing
# inputs land in the package's testdata/fuzz/<Name>/ as Go writes them; the script exits non-zero
# when any target fails and lists the failures at the end.
#
# Environment: FUZZ_PKGS limits the packages (default ./...); FUZZ_PARALLEL sets -parallel (1);
# FUZZ_RUN_FLAGS adds flags (e.g. "-race" or "-asan", see docs/sanitizers.md).
set -uo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
duration="${1:-${FUZZTIME:-30s}}"
if ! [[ "$duration" =~ ^[0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h|x)$ ]]; then
	echo "fuzz.sh: duration $duration is not a Go duration (e.g. 30s, 2m) or a count (e.g. 1000x)" >&2
	exit 2
fi
parallel="${FUZZ_PARALLEL:-1}"
# shellcheck disable=SC2206
extra=(${FUZZ_RUN_FLAGS:-})
pkgs=$(go list ${FUZZ_PKGS:-./...}) || { echo "fuzz.sh: go list failed" >&2; exit 2; }

failed=()
ran=0
for pkg in $pkgs; do
	# -list runs no test; it compiles the package's tests and prints matching names.
	if ! listing=$(go test "${extra[@]}" -list '^Fuzz' "$pkg" 2>&1); then
		echo "$listing" >&2
		failed+=("$pkg (tests do not build)")
		continue
	fi
	targets=$(echo "$listing" | grep '^Fuzz' || true)
	for t in $targets; do
		echo "== $pkg $t ($duration)"
		ran=$((ran + 1))
		if ! go test "${extra[@]}" -run '^$' -fuzz "^${t}\$" -fuzztime "$duration" -parallel "$parallel" "$pkg"; then
			failed+=("$pkg $t")
		fi
	done
done
echo "fuzz.sh: $ran targets run for $duration each"
if [ "${#failed[@]}" -gt 0 ]; then
	printf 'fuzz.sh: FAILED %s\n' "${failed[@]}" >&2
	exit 1
fi
if [ "$ran" -eq 0 ]; then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi
