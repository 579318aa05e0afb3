# Common tasks. `make run` starts a local PostgreSQL (in .data/pg) and Comb on it.

SHELL := /bin/bash

# Where `make run` serves Comb (comb reads COMB_LISTEN from the environment).
COMB_LISTEN ?= 127.0.0.1:6632
export COMB_LISTEN

.PHONY: help run stop test lint fmt build

help:
	@echo "make run    start the development PostgreSQL (unless DATABASE_URL is set) and Comb on $(COMB_LISTEN)"
	@echo "make stop   stop the development PostgreSQL"
	@echo "make test   formatting, lints and the full test suite (what CI runs)"
	@echo "make lint   check formatting and run clippy"
	@echo "make fmt    format the code"
	@echo "make build  build everything"

run:
	@if [ -z "$${DATABASE_URL:-}" ]; then scripts/dev-postgres.sh start; fi
	cargo build --release -p comb
	@url="$${DATABASE_URL:-$$(scripts/dev-postgres.sh url)}"; \
	echo "Comb is serving on http://$(COMB_LISTEN) (database: $$url)"; \
	DATABASE_URL="$$url" exec target/release/comb serve

stop:
	scripts/dev-postgres.sh stop

test:
	scripts/install-postgres.sh
	scripts/install-tools.sh
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo test --workspace

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

build:
	cargo build --workspace --all-targets
