#!/usr/bin/env bash
# docs/BENCHMARKS.md is assembled, never edited: text written into it by hand is lost at the next run
# (and fails `go test ./cmd/kvbench -run TestBenchmarksDocument`). To keep such a hunk, move it into the
# docs/benchmarks/NAME.md it belongs to (the file's top heading becomes ###; links written from
# docs/benchmarks/; summary-table rows into docs/benchmarks/targets.txt), keep the old document in
# /tmp/old.md, run `SKIP_GO_BENCH=1 SKIP_KVBENCH=1 BENCH_RAW=docs/bench/raw scripts/bench.sh`, and check
# `grep -vxFf docs/BENCHMARKS.md /tmp/old.md | grep -v '^#'` lists only the machine line and reworded links.
# make bench: regenerates docs/BENCHMARKS.md from one run — every Go benchmark on one core (raw
# output in .cache/bench/), kvbench's routing sweep and overhead figures (JSON in
# .cache/bench/kvbench/, charts in docs/bench/), then assembles the document with the earlier
# sections of docs/benchmarks/ kept verbatim beside this run's figures.
#   BENCHTIME=1s      go test -benchtime for the component benchmarks
#   KVBENCH_ARGS=     extra flags for the kvbench sweep (e.g. --quick)
#   SKIP_GO_BENCH=1   reuse the component benchmarks already in .cache/bench/
#   SKIP_KVBENCH=1    reuse kvbench's JSON already in .cache/bench/kvbench/ (charts are not redrawn)
#   BENCH_RAW=dir     where the raw results are (default .cache/bench)
#   BENCH_DOC=file    the document to write (default docs/BENCHMARKS.md)
# A measuring run copies its raw results (not the binaries) to docs/bench/raw/, committed with the
# document: SKIP_GO_BENCH=1 SKIP_KVBENCH=1 then regenerates the document in any checkout (e.g. after
# merging other sections of docs/benchmarks/) from docs/bench/raw/ when .cache/bench has no run.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
out=${BENCH_RAW:-.cache/bench}
measure=1
if [ -n "${SKIP_GO_BENCH:-}" ] && [ -n "${SKIP_KVBENCH:-}" ]; then
  measure=""
  if [ -z "${BENCH_RAW:-}" ] && [ ! -f "$out/machine.txt" ]; then
    out=docs/bench/raw
  fi
  echo "== document only, from the raw results in $out/"
fi
bin=.cache/bench # the binaries, never copied with the raw results
mkdir -p "$out/kvbench" "$bin" docs/bench
# The machine line describes the run that measured: a document-only pass keeps it.
if [ -n "$measure" ] || [ ! -f "$out/machine.txt" ]; then
  echo "cores: $(nproc), cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(go version | cut -d' ' -f3-), load average at start: $(cut -d' ' -f1-3 /proc/loadavg), started $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')" > "$out/machine.txt"
fi
cat "$out/machine.txt"
benchtime=${BENCHTIME:-1s}
if [ -z "${SKIP_GO_BENCH:-}" ]; then
  for pkg in gateway/hashcore gateway/inventory gateway/tokenize gateway/ingest gateway/route gateway/proxy \
             engines/vllm engines/sglang engines/trtllm engines/sim bench/kvbench; do
    file="$out/$(echo "$pkg" | tr / _).txt"
    if ! list=$(go test -list 'Benchmark.*' "./$pkg" 2>&1); then
      # Recorded, not skipped silently: the document says this package did not build.
      { echo "# command: go test -list 'Benchmark.*' ./$pkg"; echo "# FAILED to build:"; echo "$list" | sed 's/^/# /'; } > "$file"
      echo "== ./$pkg did not build; recorded in $file"
      continue
    fi
    if ! grep -q '^Benchmark' <<<"$list"; then
      continue
    fi
    cmd="go test -run '^\$' -bench . -benchmem -cpu 1 -benchtime $benchtime ./$pkg"
    echo "== $cmd"
    { echo "# command: $cmd"; echo "# cores: $(nproc)"; } > "$file"
    # A package that fails its benchmarks is recorded as such; the rest of the run goes on.
    if ! eval "$cmd" 2>&1 | tee -a "$file"; then
      echo "# FAILED" >> "$file"
    fi
  done
  if [ -x scripts/bench-hf-tokenizers.sh ]; then
    scripts/bench-hf-tokenizers.sh | tee "$out/hf-tokenizers.txt" || echo "HuggingFace baseline skipped (see above)"
  fi
fi
go build -buildvcs=auto -o "$bin/kvbench-bin" ./cmd/kvbench
if [ -z "${SKIP_KVBENCH:-}" ]; then
  # The gateway of the proxy comparison runs as its own process, like nginx: built from this tree.
  # (-buildvcs=auto: the binaries record the commit they measure, whatever GOFLAGS says.)
  go build -buildvcs=auto -o "$bin/gateway-bin" ./cmd/gateway
  # The sweep saves results.json after every cell. Exit status 3: every cell ran but some failed
  # (recorded with their reasons, which the document lists); any other failure (interrupted, no
  # tokenizer) leaves the cells measured so far, which the document shows as a partial run. Either
  # way the other steps and the document still run; the script's status says something failed.
  failed=""
  rc=0
  # shellcheck disable=SC2086
  "$bin/kvbench-bin" --out "$out/kvbench" --charts docs/bench ${KVBENCH_ARGS:-} || rc=$?
  case "$rc" in
    0) ;;
    3) echo "== kvbench sweep: some cells failed (see above); the document lists them"; failed="$failed sweep(cells)" ;;
    *) echo "== kvbench sweep exited $rc; the document shows the cells it measured"; failed="$failed sweep($rc)" ;;
  esac
  # Exit status 3: the proxy comparison did not run (e.g. nginx or wrk missing: apt-get install -y
  # nginx-light wrk) but overhead.json was written with the reason, which the document prints.
  rc=0
  "$bin/kvbench-bin" overhead --out "$out/kvbench" --charts docs/bench --gateway "$bin/gateway-bin" || rc=$?
  case "$rc" in
    0) ;;
    3) echo "== kvbench overhead: proxy comparison not run (see above); the document says why" ;;
    *) echo "== kvbench overhead exited $rc"; failed="$failed overhead($rc)" ;;
  esac
  # Pool scale: 16 and 64 endpoints over 10M resident keys, prompts up to 100k tokens
  # (KVBENCH_SCALE_ARGS, e.g. --resident 10000000,100000000 for the 100M cell: about 3 GiB).
  rc=0
  # shellcheck disable=SC2086
  "$bin/kvbench-bin" scale --out "$out/kvbench" ${KVBENCH_SCALE_ARGS:-} || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "== kvbench scale exited $rc"; failed="$failed scale($rc)"
  fi
fi
doc=${BENCH_DOC:-docs/BENCHMARKS.md}
"$bin/kvbench-bin" doc --raw "$out" --sections docs/benchmarks --charts docs/bench --out "$doc"
echo "$doc regenerated; raw results in $out/"
if [ -n "$measure" ] && [ "$out" != docs/bench/raw ]; then
  rm -rf docs/bench/raw && mkdir -p docs/bench/raw/kvbench
  cp "$out"/*.txt docs/bench/raw/
  cp "$out"/kvbench/*.json "$out"/kvbench/*.md docs/bench/raw/kvbench/ 2>/dev/null || true
  echo "raw results copied to docs/bench/raw/ (commit them with the document)"
fi
if [ -n "${failed:-}" ]; then
  echo "== failed:$failed"
  exit 1
fi
