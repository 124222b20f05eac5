# hearth — see README.md. `make run` and `make test` are the two entry points.
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
BINARIES := $(patsubst cmd/%/,%,$(dir $(wildcard cmd/*/main.go)))
FUZZTIME ?= 5s

# Each fuzz target gets a short run in make test so it cannot rot:
# package:FuzzName pairs.
FUZZ_TARGETS := $(shell grep -rl --include='*_test.go' '^func Fuzz' . 2>/dev/null | \
	xargs -r grep -H -o '^func Fuzz[A-Za-z0-9_]*' | \
	sed -E 's|^\./(.*)/[^/]*_test.go:func (Fuzz[A-Za-z0-9_]*)|\1:\2|' | sort -u)

.PHONY: all build run test unit fuzz lint bench deb ollama clean

all: build

build:
	@mkdir -p bin
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ $(addprefix ./cmd/,$(BINARIES))

# The whole deployment on loopback: Ollama + tiny model + hearthd + a key.
run:
	@scripts/run.sh

ollama:
	@scripts/ensure-ollama.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Every test: vet, the race detector over all packages (the real-Ollama
# integration tests included), then a short run of every fuzz target.
test: lint unit fuzz

unit:
	HEARTH_OLLAMA_BIN=$$(scripts/ensure-ollama.sh) $(GO) test -race -count=1 -timeout 30m ./...

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		out=$$($(GO) test -run='^$$' -fuzz="^$$fn\$$" -fuzztime=$(FUZZTIME) ./$$pkg 2>&1) || \
			{ echo "$$out"; echo "fuzz $$pkg $$fn FAILED"; exit 1; }; \
	done

bench:
	HEARTH_OLLAMA_BIN=$$(scripts/ensure-ollama.sh) $(GO) run ./cmd/hearth-bench

# hearth_<version>_amd64.deb (binaries, units, conffiles) with nfpm.
deb:
	packaging/build-deb.sh $(VERSION) dist

clean:
	rm -rf bin dist
