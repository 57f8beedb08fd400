#!/usr/bin/env bash
# kube-apiserver.sh — build the pinned Kubernetes API server and etcd into .cache/kube/bin, for the
# tests that talk to a real API server (internal/kubetest). The versions are pinned by tools/kube/go.mod
# (k8s.io/kubernetes with each staging module replaced by its published release, and etcd's server
# module), fetched through the Go module proxy; nothing comes from a container registry.
#
# A build whose inputs (that module, this script, the Go toolchain) are unchanged is left alone, so
# calling this from .ci/run costs nothing after the first time.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
mod="$repo/tools/kube"
out="$repo/.cache/kube"
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"

kube_version="$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$mod/go.mod")"
stamp="$({ cat "$mod/go.mod" "$mod/go.sum" "$0"; go version; } | sha256sum | cut -d' ' -f1)"
if [ -f "$out/.kvexact-stamp" ] && [ "$(cat "$out/.kvexact-stamp")" = "$stamp" ] &&
	[ -x "$out/bin/kube-apiserver" ] && [ -x "$out/bin/etcd" ]; then
	exit 0
fi

echo "kube-apiserver: building kube-apiserver $kube_version and etcd into $out/bin"
start=$(date +%s)
rm -rf "$out"
mkdir -p "$out/bin.tmp"
# The version the server reports (/version, and the emulation version it derives from it).
ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=$kube_version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=$(echo "${kube_version#v}" | cut -d. -f1)"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(echo "${kube_version#v}" | cut -d. -f2)"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/bin.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcd" go.etcd.io/etcd/server/v3)
mv "$out/bin.tmp" "$out/bin"
echo "$stamp" > "$out/.kvexact-stamp"
echo "kube-apiserver: ready in $(( $(date +%s) - start )) s, $(du -sh "$out" | cut -f1)"
