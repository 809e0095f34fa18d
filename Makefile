# One cargo profile (release) for the binary, unit and integration tests: compiled once.
# Cargo commands act on default-members (crates/*); the Python extension builds through maturin.
CARGO ?= cargo
DATA ?= tessera-data

.PHONY: up test e2e build deps lint bench bench-cluster bench-ec chaos conformance model

deps:
	@scripts/timed deps scripts/install-deps.sh

build: deps
	scripts/timed build $(CARGO) build --release

## Build, then run the embedded default cluster (6 nodes, 4+2) under ./tessera-data until Ctrl-C.
up: build
	./target/release/tessera up --data $(DATA)

## Install what the build needs, then run every test (unit, property, multi-process integration,
## then end to end: aws-cli, boto3, s3fs, pyarrow and DuckDB against a local cluster and gateway,
## then the Python package: numpy/torch zero-copy reads, DataLoader, DDP, checkpoints, fsspec,
## then the write protocol's bounded model check (make model), then a short fault-injection run
## over the regression seeds: chaos/run.sh).
test: build lint
	scripts/timed "cargo test" $(CARGO) test --release
	scripts/timed model ./target/release/tessera-model
	scripts/timed e2e e2e/run.sh
	scripts/timed python python/run-tests.sh
	scripts/timed chaos chaos/run.sh

## The long fault-injection run: DURATION seconds per seed, three random seeds (SEEDS="1 2" to
## replay given ones). Needs root: nodes run in network namespaces. See RELIABILITY.md.
DURATION ?= 600
SEEDS ?=
chaos: build
	./target/release/tessera-model --impairments 2
	./target/release/tessera-model --writers 2 --k 1 --m 1 --depth 16
	./target/release/tessera-model --writers 2 --k 2 --m 1 --faults 1 --depth 14
	chaos/run.sh --long $(DURATION) $(SEEDS)

## The write protocol's model (crates/model): every reachable state of one erasure set (3 + 2,
## one writer beside the initial version, bounded faults and outages) checked against the
## durability invariants; ARGS for larger runs (--impairments 2, --large; two writers, who
## overlap and re-stamp, fit only depth-bounded runs: --writers 2 --k 1 --m 1 --depth 16).
model: ;	$(CARGO) run --release -p model --bin tessera-model -- $(ARGS)

## End-to-end suite only (installs e2e/requirements.txt into .venv); ARGS go to pytest.
e2e: build
	e2e/run.sh $(ARGS)

## S3 behaviour against MinIO (e2e/test_differential.py): the same requests to both, answers
## compared, deliberate differences listed with their reasons; the rest of the e2e suite runs
## too (about a minute). Builds MinIO once (go install, cached in bench/.cache, as `make bench`).
conformance: build
	python3 -c 'import sys; sys.path.insert(0, "bench"); import compare_minio; compare_minio.ensure_minio()'
	TESSERA_MINIO=$(CURDIR)/bench/.cache/bin/minio e2e/run.sh e2e/test_differential.py $(ARGS)

lint:
	scripts/check-feature-unification.sh
	$(CARGO) fmt --all -- --check
	scripts/timed clippy $(CARGO) clippy --release --all-targets -- -D warnings

## Tessera vs MinIO, quick mode (~3 minutes after a one-time MinIO build): bench/compare-minio.sh.
bench: build
	bench/compare-minio.sh --quick

## Smart-client GET/PUT on a fresh local cluster: healthy, 1 and 2 nodes down.
bench-cluster: build
	bench/cluster-bench.sh

## Erasure coding against ISA-L direct and klauspost/reedsolomon (Go).
bench-ec: deps
	bench/ec-compare.sh
