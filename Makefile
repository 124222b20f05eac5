# hearth — see README.md. `make run` and `make test` are the two entry points.
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
BINARIES := $(patsubst cmd/%/,%,$(dir $(wildcard cmd/*/main.go)))
# Executions per fuzz target in make test (a count: see scripts/fuzz.sh).
FUZZTIME ?= 40000x

# Each fuzz target gets a short run in make test so it cannot rot:
# package:FuzzName pairs.
FUZZ_TARGETS := $(shell grep -rl --include='*_test.go' '^func Fuzz' . 2>/dev/null | \
	xargs -r grep -H -o '^func Fuzz[A-Za-z0-9_]*' | \
	sed -E 's|^\./(.*)/[^/]*_test.go:func (Fuzz[A-Za-z0-9_]*)|\1:\2|' | sort -u)

.PHONY: all build run check test deps unit fuzz lint bench bench-fleet soak deb ollama terraform terraform-provider terraform-docs console-screenshots clean

all: build

build:
	@mkdir -p bin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

# The whole product on loopback: the control plane, an enrolled node (Ollama,
# tiny model), a deployment server and a key made through the management API.
run:
	@scripts/run.sh

# Every Ollama version of the test matrix, built if missing.
ollama:
	@scripts/ensure-ollama.sh --all

# The Terraform CLI the provider's tests drive (1.5.7, the last MPL-2.0
# release), built from source if missing.
terraform:
	@scripts/ensure-terraform.sh

# The Terraform provider (not in the .deb), and the ~/.terraformrc lines
# that make Terraform use it without a registry.
terraform-provider:
	@mkdir -p bin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/terraform-provider-hearth
	@printf '%s\n' "bin/terraform-provider-hearth built. To use it, put in ~/.terraformrc:" "" \
		"provider_installation {" "  dev_overrides {" "    \"hearthd/hearth\" = \"$(CURDIR)/bin\"" "  }" "  direct {}" "}"

# docs/terraform/ from the provider's schema, examples and templates
# (tfplugindocs); a test checks they are in step.
terraform-docs:
	@scripts/terraform-docs.sh

# docs/console/*.png: each page of the web console, as its browser test
# (e2e TestConsoleBrowser, in Chromium) sees it.
console-screenshots: deps
	@mkdir -p docs/console
	HEARTH_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console HEARTH_OLLAMA_BIN=$$(scripts/ensure-ollama.sh) \
		$(GO) test -count=1 -run '^TestConsoleBrowser$$' ./e2e/

# The Debian packages the tests need: installed as root, else the apt-get
# line to run.
deps:
	@scripts/ensure-deps.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# The unit tier, before each commit (no root, Ollama, PostgreSQL, nginx,
# sshd or network namespaces: `-short` skips the tests that need them, see
# testutil.Integration); about 3 minutes.
check: lint
	$(GO) test -short -race -count=1 ./...

# Every test: the packages they need, vet, the race detector over all
# packages (the real-Ollama integration tests on every version of the
# matrix included), then a short run of every fuzz target.
test: deps lint unit fuzz

# HEARTH_OLLAMA_BINS lists the matrix (VERSION=PATH,...) for
# internal/ollamatest; HEARTH_OLLAMA_BIN is the current version, for tests
# that use one; TF_ACC_TERRAFORM_PATH is the Terraform CLI the provider's
# tests drive.
unit: deps
	@set -e; bins=$$(scripts/ensure-ollama.sh --all); bins=$$(echo "$$bins" | paste -sd, -); \
	bin=$$(scripts/ensure-ollama.sh); tf=$$(scripts/ensure-terraform.sh); \
	echo "HEARTH_OLLAMA_BINS=$$bins HEARTH_OLLAMA_BIN=$$bin TF_ACC_TERRAFORM_PATH=$$tf scripts/suite.sh"; \
	HEARTH_OLLAMA_BINS=$$bins HEARTH_OLLAMA_BIN=$$bin TF_ACC_TERRAFORM_PATH=$$tf GO="$(GO)" scripts/suite.sh

fuzz:
	@FUZZTIME=$(FUZZTIME) scripts/fuzz.sh $(FUZZ_TARGETS)

bench:
	HEARTH_OLLAMA_BIN=$$(scripts/ensure-ollama.sh) $(GO) run ./cmd/hearth-bench

# hearthd supervising a real Ollama 0.17.4 under mixed traffic (streams,
# abandoned streams, Responses, embeddings) for SOAK_DURATION; the report
# and its targets are in BENCHMARKS.md, "Soak". Not part of `make test`.
SOAK_DURATION ?= 10m
soak:
	HEARTH_OLLAMA_BIN=$$(scripts/ensure-ollama.sh) $(GO) run ./cmd/hearth-bench soak --duration $(SOAK_DURATION) --out bench/results/soak-latest.json

# The control plane under a simulated fleet of 10 000 nodes, on Pebble and on
# PostgreSQL with one and two replicas (see BENCHMARKS.md, "Fleet").
# FLEETFLAGS passes hearth-bench fleet flags, e.g.
# FLEETFLAGS='--nodes 1000 --backends pebble --profile /tmp/fleetprof'.
bench-fleet: deps
	$(GO) run ./cmd/hearth-bench fleet $(FLEETFLAGS)

# hearth_<version>_amd64.deb (binaries, units, conffiles) with nfpm.
deb:
	packaging/build-deb.sh $(VERSION) dist

clean:
	rm -rf bin dist
