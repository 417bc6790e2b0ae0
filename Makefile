# kumi — make targets. `make demo` and `make test` need nothing started by
# hand: without DATABASE_URL they start a throwaway PostgreSQL from the local
# server binaries (apt-get install -y postgresql).

GO ?= go
PKGS ?= ./...
TEST_FLAGS ?= -race -count=1 -timeout 30m

.PHONY: all build test test-short bench lint demo fmt vet chaos jaeger test-jaeger fuzz tidy

all: lint test

build:
	$(GO) build $(PKGS)

## test: every test against a real PostgreSQL, with the race detector.
test:
	$(GO) test $(TEST_FLAGS) $(PKGS)

## bench: benchmarks that print figures (see docs/benchmarks.md).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(BENCH_FLAGS) ./eventsource/ ./leasestore/ ./actors/ ./internal/overflow/

## lint: gofmt, go vet.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

## demo: several worker processes sharing a subscription, live in the terminal.
demo:
	$(GO) run ./cmd/demo $(DEMO_FLAGS)
