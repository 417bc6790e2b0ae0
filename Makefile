# kumi — make targets. `make demo` and `make test` need nothing started by
# hand: without DATABASE_URL they start a throwaway PostgreSQL from the local
# server binaries and PgBouncer (apt-get install -y postgresql pgbouncer).

GO ?= go
PKGS ?= ./...
TEST_FLAGS ?= -race -count=1 -timeout 30m

.PHONY: all build test bench lint demo fmt vet chaos jaeger test-jaeger fuzz sim tidy

all: lint test

build:
	$(GO) build $(PKGS)

## test: every test against a real PostgreSQL, with the race detector.
test:
	tools/deps.sh test
	$(GO) test $(TEST_FLAGS) $(PKGS)
	@echo "the lease suite again, every pass through a PassBatcher (as a runtime's groups pass)"
	KUMI_LEASE_BATCHED=1 $(GO) test $(TEST_FLAGS) ./leasestore/
	@echo "the lease suite again, each worker's KindSession stores on one shared session connection (leasestore.Sessions, as a runtime's groups hold them)"
	KUMI_LEASE_SHARED_SESSIONS=1 $(GO) test $(TEST_FLAGS) ./leasestore/

## bench: benchmarks that print figures (see docs/benchmarks.md).
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m $(BENCH_FLAGS) ./eventsource/ ./leasestore/ ./actors/ ./internal/overflow/

## lint: gofmt, go vet, golangci-lint (.golangci.yml; the version pinned in
## tools/golangci/go.mod, built once into bin/), and the public surface's
## size (tools/apisurface).
GOLANGCI := bin/golangci-lint
lint: $(GOLANGCI)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GOLANGCI) run --timeout 15m $(PKGS)
	$(GO) run ./tools/apisurface

$(GOLANGCI): tools/golangci/go.mod tools/golangci/go.sum
	@echo "building golangci-lint (the first time takes a few minutes)"
	cd tools/golangci && $(GO) build -o ../../$(GOLANGCI) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

## vet: go vet alone.
vet:
	$(GO) vet $(PKGS)

## fmt: gofmt every tracked Go file in place.
fmt:
	gofmt -w $$(git ls-files '*.go')

## tidy: go mod tidy.
tidy:
	$(GO) mod tidy

## demo: several worker processes sharing a subscription, live in the terminal.
demo:
	tools/deps.sh demo
	$(GO) run ./cmd/demo $(DEMO_FLAGS)

## chaos: the long form of the multi-process fault scenarios (figures in docs/benchmarks.md).
chaos:
	KUMI_CHAOS=long $(GO) test -count=1 -timeout 60m -v -run 'Test' ./test/integration/

## sim: the simulations of the core's state machines (internal/readfeed,
## internal/resizepart, internal/coordplan, internal/checkpointing,
## internal/window) and of a whole pool built from them (internal/poolsim), each over
## SIM_SEEDS schedules (`make test` runs 1,000-2,000 each); no database. A
## failing seed prints its trace's tail; `go test -run TestSim ./internal/<pkg>/
## -seed N` replays it whole.
SIM_SEEDS ?= 20000
SIM_PKGS := ./internal/readfeed/ ./internal/resizepart/ ./internal/coordplan/ ./internal/checkpointing/ ./internal/window/ ./internal/poolsim/
sim:
	$(GO) test -count=1 -timeout 0 -run '^TestSim$$' $(SIM_PKGS) -seeds $(SIM_SEEDS)

## fuzz: each fuzz target for a short while (seed corpora run in `make test`).
FUZZTIME ?= 20s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseStreamName -fuzztime $(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz FuzzHash -fuzztime $(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz FuzzLeaseConfig -fuzztime $(FUZZTIME) ./test/fuzz/
	$(GO) test -run '^$$' -fuzz FuzzConnStringRedaction -fuzztime $(FUZZTIME) ./test/fuzz/

## jaeger: build (once, cached) and start Jaeger v2 on loopback.
jaeger:
	tools/jaeger/jaeger.sh start

## test-jaeger: end-to-end: two workers and a producer export to a real Jaeger.
test-jaeger:
	eval "$$(tools/jaeger/jaeger.sh start)" && $(GO) test -count=1 -tags jaeger -v -run 'Jaeger' ./observability/... ./internal/jaegertest/ ./test/e2e/
