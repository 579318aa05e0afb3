# Common tasks. `make run` starts a local PostgreSQL (in .data/pg) and Comb on it.

SHELL := /bin/bash

# Where `make run` serves Comb (comb reads COMB_LISTEN from the environment).
COMB_LISTEN ?= 127.0.0.1:6632
export COMB_LISTEN

.PHONY: help run stop test lint fmt build

help:
	@echo "make run    start the development PostgreSQL (unless DATABASE_URL is set) and Comb on $(COMB_LISTEN)"
	@echo "            (with a development encryption key, made in .data/encryption.key on first use)"
	@echo "make stop   stop the development PostgreSQL"
	@echo "make test   formatting, lints and the full test suite, the data path on PostgreSQL and on Citus (what CI runs)"
	@echo "make lint   check formatting and run clippy"
	@echo "make fmt    format the code"
	@echo "make build  build everything"

run:
	@if [ -z "$${DATABASE_URL:-}" ]; then scripts/dev-postgres.sh start; fi
	cargo build --release -p comb-cli
	@url="$${DATABASE_URL:-$$(scripts/dev-postgres.sh url)}"; \
	key="$${COMB_ENCRYPTION_KEY:-$${QUEEN_ENCRYPTION_KEY:-$$(scripts/dev-key.sh)}}"; \
	echo "Comb is serving on http://$(COMB_LISTEN) (database: $$url)"; \
	DATABASE_URL="$$url" COMB_ENCRYPTION_KEY="$$key" exec target/release/comb serve

stop:
	scripts/dev-postgres.sh stop

test:
	scripts/install-postgres.sh
	scripts/install-citus.sh
	scripts/install-tools.sh
	scripts/install-chromium.sh
	scripts/install-queen-clients.sh
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	scripts/build-release.sh
	cargo test --workspace
	COMB_TESTS_WITH_TOKENS=1 cargo test -p comb --test suite -- queen_compat:: admin::
	scripts/test-citus.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

build:
	cargo build --workspace --all-targets

# Benchmarks (docs/benchmarks.md). `make bench` runs every cell, prints one table and records
# it in bench/results/latest.json and docs/benchmarks.md; `make bench CELLS=push1,push100` runs
# a subset (results in bench/results/subset.json). `comb-bench --list` names the cells.
CELLS ?=
BENCH_ARGS ?=

.PHONY: bench bench-smoke bench-peer-smoke bench-profile

bench:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	@if [ -z "$(CELLS)" ]; then \
		set -x; target/release/comb-bench --cells "" --command "make bench" \
			--json bench/results/latest.json --doc docs/benchmarks.md $(BENCH_ARGS); \
	else \
		set -x; target/release/comb-bench --cells "$(CELLS)" --command "make bench CELLS=$(CELLS)" \
			--json bench/results/subset.json $(BENCH_ARGS); \
	fi

# A few seconds per cell: proves the suite runs end to end. Its numbers mean nothing.
bench-smoke:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	target/release/comb-bench --smoke --cells "$(CELLS)" --baseline /dev/null $(BENCH_ARGS)

# `comb-bench --peer` end to end, with Comb itself as the peer (smoke mode).
bench-peer-smoke:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	scripts/bench-peer-smoke.sh

# Same cells with pg_stat_statements, wait-event sampling, WAL by record type (pg_waldump) and
# `perf record -a`; reports go to bench/results/profile/<cell>.txt and <cell>.perf.txt.
# Profiling costs CPU: these runs find what bounds a cell, they do not measure it.
bench-profile:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	target/release/comb-bench --cells "$(CELLS)" --profile bench/results/profile --perf \
		--json bench/results/profile/rows.json $(BENCH_ARGS)

.PHONY: chaos chaos-ha fuzz

# Fault scenarios, each with the delivery audit running throughout (about 11 minutes; the
# last, worker-lost, on a Citus cluster), the failover scenarios (chaos-ha, below), then
# the long fuzz run. The short audit and a bounded
# fuzz run are part of `make test`. Output is also kept in target/chaos.log;
# docs/reliability.md records the results.
chaos:
	scripts/install-postgres.sh
	scripts/install-ha.sh
	scripts/install-citus.sh
	cargo build --release -p comb-cli -p comb-audit
	set -o pipefail; { \
		target/release/comb-audit chaos --comb target/release/comb && \
		target/release/comb-audit chaos-ha --comb target/release/comb && \
		target/release/comb-audit fuzz --comb target/release/comb --cases 30000 && \
		target/release/comb-audit fuzz --comb target/release/comb --cases 10000 --tokens; \
	} 2>&1 | tee target/chaos.log

# Failover (docs/high-availability.md): etcd and three PostgreSQL nodes under Patroni on
# loopback (Debian's patroni and etcd-server packages, installed when missing), two Comb
# servers given the multi-host URL, the delivery audit through a switchover, a crash of the
# primary, its return as a standby and a crash with asynchronous replication (about 3
# minutes, stopped after 14). Output is also kept in target/chaos-ha.log.
chaos-ha:
	scripts/install-postgres.sh
	scripts/install-ha.sh
	cargo build --release -p comb-cli -p comb-audit
	set -o pipefail; target/release/comb-audit chaos-ha --comb target/release/comb 2>&1 \
		| tee target/chaos-ha.log

# The long fuzz runs alone: without tokens, and against a server requiring them.
fuzz:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-audit
	target/release/comb-audit fuzz --comb target/release/comb --cases 30000
	target/release/comb-audit fuzz --comb target/release/comb --cases 10000 --tokens

# Comb, then the SKIP LOCKED table, at a fixed rate through a clean phase, a held
# REPEATABLE READ snapshot and its release (about 33 minutes); records the
# "Held snapshot" section of docs/long-runs.md and bench/results/xmin.json.
# `make bench-xmin BENCH_ARGS=--smoke` is a 3-minute run that proves the tool works and
# writes nothing.
.PHONY: bench-xmin

bench-xmin:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	target/release/comb-bench xmin --command "make bench-xmin" \
		--json bench/results/xmin.json --doc docs/long-runs.md $(BENCH_ARGS)

# A 30-minute soak (about 35 minutes in all): the peak delivered rate measured first, then
# fixed-rate pushes at 70 % of it with explicit-ack consumers, 2-minute segments and a queue
# with retentionSeconds 300 and completedRetentionSeconds 120; size, dead tuples and segment
# tables every 10 s and the slope of the total size. Records the "Soak" section of
# docs/long-runs.md and bench/results/soak.json. Not part of `make bench`.
# `make bench-soak BENCH_ARGS=--smoke` is a 2-minute run that proves the tool works and writes
# nothing.
.PHONY: bench-soak

bench-soak:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	target/release/comb-bench soak --command "make bench-soak" \
		--json bench/results/soak.json --doc docs/long-runs.md $(BENCH_ARGS)

# Queen 1.0's soak shape (the `queen1` cell's load, docs/queen1.md) for 30 minutes at 80 % of
# its searched maximum, sampled every 10 s (rate, e2e p99, broker RSS), then every message
# audited. `make bench-queen1-soak BENCH_ARGS="--duration-s 180"` for a shorter run;
# `BENCH_ARGS=--smoke` proves the tool works and writes nothing.
.PHONY: bench-queen1-soak

bench-queen1-soak:
	scripts/install-postgres.sh
	cargo build --release -p comb-cli -p comb-bench
	target/release/comb-bench queen1-soak --command "make bench-queen1-soak $(BENCH_ARGS)" \
		--json bench/results/queen1-soak.json --doc docs/queen1.md $(BENCH_ARGS)
