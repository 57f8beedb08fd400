#!/usr/bin/env bash
# pyenv.sh [NAME ...] — make the project's pinned Python environments under .cache/py/NAME, one per
# scripts/python/NAME.txt (exact pins, transitive ones included). With no NAME, every environment.
#
# An environment whose requirements (and install hook) are unchanged since it was made is left alone,
# so calling this from .ci/run and from make targets costs nothing after the first time. When
# scripts/python/NAME.sh exists it installs the environment instead of `pip install -r NAME.txt`
# (for packages that need --no-deps or an order); it gets the venv's python as $1 and NAME.txt as $2.
#
# Nothing here downloads model weights: HF_HUB_OFFLINE=1 for every install and hook.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
reqdir="$repo/scripts/python"
root="$repo/.cache/py"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# The interpreter: Debian's python3 (what a fresh machine and the container images have), else any.
py=/usr/bin/python3
[ -x "$py" ] || py="$(command -v python3)"

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
	for f in "$reqdir"/*.txt; do names+=("$(basename "$f" .txt)"); done
fi

for name in "${names[@]}"; do
	req="$reqdir/$name.txt"
	hook="$reqdir/$name.sh"
	[ -f "$req" ] || { echo "pyenv: no requirements file $req" >&2; exit 2; }
	env="$root/$name"
	stamp="$({ cat "$req"; if [ -f "$hook" ]; then cat "$hook"; fi; } | sha256sum | cut -d' ' -f1)"
	if [ -f "$env/.kvexact-stamp" ] && [ "$(cat "$env/.kvexact-stamp")" = "$stamp" ]; then
		continue
	fi
	echo "pyenv: making $env from $req"
	start=$(date +%s)
	rm -rf "$env"
	"$py" -m venv "$env"
	if [ -f "$hook" ]; then
		bash "$hook" "$env/bin/python" "$req"
	else
		"$env/bin/python" -m pip install -q --no-input -r "$req"
	fi
	echo "$stamp" > "$env/.kvexact-stamp"
	echo "pyenv: $name ready in $(( $(date +%s) - start )) s, $(du -sh "$env" | cut -f1)"
done
