# rdaq: `make run` and `make test` install what is missing, then run. See README.md.
.PHONY: setup run test test-rust test-e2e bench fmt miri

setup:
	./scripts/setup.sh

run: setup
	./target/release/rdaq run

test: setup test-rust test-e2e

test-rust:
	cargo test --release --workspace

# pytest exits 5 when it collected no tests: that is a failure of the suite here too,
# except when a subset was selected on purpose with PYTEST_ARGS.
test-e2e:
	.venv/bin/python -m pytest -q tests $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ] && [ -n "$(PYTEST_ARGS)" ]; then exit 0; else exit $$rc; fi

bench: setup
	./target/release/rdaq bench ingest

# Undefined-behaviour check of the receiver's placement (its unsafe code) under Miri; needs
# the nightly toolchain with the miri component, and minutes (not part of `make test`).
miri:
	PROPTEST_CASES=8 MIRIFLAGS=-Zmiri-disable-isolation cargo +nightly miri test -p rdaq-receiver --test placement
