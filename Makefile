# rdaq: `make run` and `make test` install what is missing, then run. See README.md.
.PHONY: setup setup-run run test test-rust test-e2e bench fmt miri deb wheel dist

# everything the tests use; `make run` installs only what the run needs
setup:
	./scripts/setup.sh

setup-run:
	./scripts/setup.sh run

run: setup-run
	./target/release/rdaq run

test: setup test-rust test-e2e

test-rust:
	cargo test --release --workspace

# The slowest tests are listed (the suite has a 30-minute budget). pytest exits 5 when it
# collected no tests: that is a failure of the suite here too, except when a subset was
# selected on purpose with PYTEST_ARGS.
test-e2e:
	.venv/bin/python -m pytest -q --durations=15 tests $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ] && [ -n "$(PYTEST_ARGS)" ]; then exit 0; else exit $$rc; fi

# the Debian package, target/debian/rdaq_<version>-1_amd64.deb (docs/install.md)
deb: setup
	./scripts/deb.sh

# the Python wheel for CPython 3.11+ on manylinux_2_28, in target/wheels (docs/install.md)
wheel: setup
	./scripts/wheel.sh

# the portable bundle for any x86-64 Linux with glibc >= 2.28, HDF5 and ZeroMQ linked in:
# target/dist/rdaq-<version>-x86_64-linux.tar.gz (docs/install.md)
dist: setup
	./scripts/dist.sh

bench: setup
	./target/release/rdaq bench ingest

# Undefined-behaviour check under Miri of the unsafe code that is Rust's own: the receiver's
# placement, the processing's AVX2 fast paths (compiled in, so that Miri runs them: it answers
# feature detection from the compile-time features), and the detector's word views. Code
# whose unsafe calls C (sockets, io_uring, AF_XDP, HDF5, zstd, CUDA, the C and Python APIs)
# cannot run under Miri. Needs the nightly toolchain with the miri component, and minutes
# (not part of `make test`).
MIRI = MIRIFLAGS=-Zmiri-disable-isolation cargo +nightly miri test
miri:
	PROPTEST_CASES=8 $(MIRI) -p rdaq-receiver --test placement
	PROPTEST_CASES=2 RUSTFLAGS="-C target-feature=+avx2,+fma" $(MIRI) -p rdaq-process --lib -- --exact --test-threads 1 \
		bitshuffle::tests::fast_shuffle_matches_definition convert::tests::the_fast_path_equals_the_word_by_word_conversion \
		convert::tests::counts_from_kev_equal_counts_from_words pedestal::tests::frames_pushed_in_pieces_update_as_every_pixel_does_alone \
		spots::local_snr::tests::box_statistics_match_a_direct_computation
	$(MIRI) -p rdaq-detector --lib -- --exact synth::tests::byte_views_are_the_little_endian_words
