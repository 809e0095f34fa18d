# One cargo profile (release) for the binary, unit and integration tests: compiled once.
CARGO ?= cargo
DATA ?= tessera-data

.PHONY: up test build deps lint bench bench-ec

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

## Build, then run the embedded default cluster (6 nodes, 4+2) under ./tessera-data until Ctrl-C.
up: build
	./target/release/tessera up --data $(DATA)

## Install what the build needs, then run every test (unit, property, multi-process integration).
test: build lint
	$(CARGO) test --release --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

## Smart-client GET/PUT on a fresh local cluster: healthy, 1 and 2 nodes down.
bench: build
	bench/cluster-bench.sh

## Erasure coding against ISA-L direct and klauspost/reedsolomon (Go).
bench-ec: deps
	bench/ec-compare.sh
