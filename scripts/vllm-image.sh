#!/usr/bin/env bash
# vllm-image.sh — build the local Docker image that runs the real vLLM engine (kvexact/vllm-cpu:dev).
#
# No registry is reachable, so the image starts from nothing: a minimal Debian bookworm root made by
# debootstrap from Debian's own mirror (the interpreter the pinned vLLM environment was made with,
# /usr/bin/python3.11, and the shared libraries its native extensions load), imported with
# `docker import`. The environment itself (.cache/py/vllm, 6.2 GB) is NOT copied into the image: the
# harness bind-mounts it read-only at the absolute path it was created at (a venv only works there),
# together with the tiny model folder. docs/containers.md has the measurements.
#
# Built once per machine: the root's tarball is kept as .cache/images/vllm-cpu-root-<digest>.tar,
# <digest> a hash of this script (which holds every input: suite, mirror, packages), and the image is
# labelled with the same digest, so a later call with unchanged inputs does nothing, and one whose
# image was removed only imports the tarball again (seconds).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
tag=kvexact/vllm-cpu:dev
suite=bookworm
mirror=http://deb.debian.org/debian
# python3.11: the venv's interpreter (pyvenv.cfg: home = /usr/bin, version 3.11.x), and
# python3-minimal for /usr/bin/python3, the path the venv's bin/python3 links to; libnuma1,
# libgomp1, libelf1: what ldd finds outside the venv for its .so files besides libc, libstdc++,
# libgcc_s and zlib (already in minbase) and libffi (python3.11's own dependency). g++ and
# libpython3.11-dev: the CPU sampler of any request that samples (temperature > 0) is a
# torch.compile'd function, and inductor builds its C++ kernels (they include Python.h) on first
# use — without a compiler the engine core dies with "InvalidCxxCompiler: No working C++ compiler";
# openssl: inductor checksums its precompiled header with the openssl command.
packages=python3.11,python3-minimal,libnuma1,libgomp1,libelf1,g++,libpython3.11-dev,openssl

digest="$(sha256sum "$0" | cut -c1-16)"
cache="$repo/.cache/images"
tarball="$cache/vllm-cpu-root-$digest.tar"

have="$(docker image inspect --format '{{index .Config.Labels "org.kvexact.inputs"}}' "$tag" 2>/dev/null || true)"
if [ "$have" = "$digest" ]; then
	exit 0
fi
start=$(date +%s)
mkdir -p "$cache"
if [ ! -f "$tarball" ]; then
	command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
	root="$(mktemp -d /tmp/kvexact-vllm-root.XXXXXX)"
	trap 'rm -rf "$root"' EXIT
	echo "vllm-image: debootstrap --variant=minbase $suite ($packages)"
	debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 ||
		{ tail -20 "$root.log" >&2; exit 1; }
	rm -f "$root.log"
	# Package lists and the .deb cache are of no use in a root that never installs again.
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
	tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
	mv "$tarball.tmp" "$tarball"
	rm -rf "$root"
	trap - EXIT
fi
docker import --change "LABEL org.kvexact.inputs=$digest" --change "LABEL org.kvexact.harness=image" \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENTRYPOINT ["/usr/bin/python3"]' "$tarball" "$tag" >/dev/null
# Older roots of this script (other digests) are no longer used by anything.
find "$cache" -maxdepth 1 -name 'vllm-cpu-root-*.tar' ! -name "vllm-cpu-root-$digest.tar" -delete
docker image prune -f --filter dangling=true --filter label=org.kvexact.harness=image >/dev/null
size="$(docker image inspect --format '{{.Size}}' "$tag")"
echo "vllm-image: $tag ($((size / 1000000)) MB, inputs $digest) ready in $(($(date +%s) - start)) s"
