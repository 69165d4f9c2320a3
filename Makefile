# The two commands a newcomer needs (README): `make run` and `make test`.
# Both install what a fresh machine lacks first (scripts/setup.sh is idempotent and quick when done).
.PHONY: run test test-quick lint docs setup tracer bench clean

# The quick night replays in real containers: the engine is started as for `make test`; when no
# engine can run here, the runner falls back to bubblewrap and the trace stage says why.
run: setup
	@scripts/engine.sh up >/dev/null || echo "heapcast: no container engine could start here (above); the quick night replays with the local (bubblewrap) runner"
	.venv/bin/heapcast run --quick --seeds

# The suite over every core (pytest-xdist: a module is one unit, sent whole to one worker; the
# costliest first: tests/costs.py). TEST_JOBS=1 runs it in one process.
TEST_JOBS ?= auto
XDIST = -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder
RESULTS = .test-results

# The suite on TensorFlow (the default), then the tests marked `backends` on JAX's CPU: the code a
# GPU machine trains with (KERAS_BACKEND=jax) is tested on every commit. It ends with the budget:
# the 15 slowest tests and the time both passes took (docs/testing.md).
test: setup lint docs
	scripts/engine.sh up
	@rm -rf $(RESULTS); mkdir -p $(RESULTS); start=$$(date +%s); \
	.venv/bin/python -m pytest -q $(XDIST) --junitxml=$(RESULTS)/tensorflow.xml \
	&& KERAS_BACKEND=jax .venv/bin/python -m pytest -q -m backends $(XDIST) \
		--junitxml=$(RESULTS)/jax.xml; \
	rc=$$?; .venv/bin/python -m tests.costs report --since $$start $(RESULTS)/*.xml; exit $$rc

# The edit-test loop: no test measured at a second or more, no real service (docs/testing.md).
test-quick: setup
	.venv/bin/python -m pytest -q -m "not integration and not slow" $(XDIST)

setup:
	scripts/setup.sh

# The documentation site (mkdocs.yml), built strict: a broken link or an unlisted page fails.
docs: setup
	.venv/bin/mkdocs build --strict --quiet --site-dir .site

# ruff: lint and format check over the whole tree (pyproject.toml [tool.ruff])
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

tracer:
	$(MAKE) -C native

# The maintained speed benchmarks (benchmarks/suite.py), cheapest first, into benchmarks/results/:
# it prints the list before running. `make bench BENCH="cli online"` runs the ones named;
# `.venv/bin/python -m benchmarks --list` lists them and the studies without running.
bench: setup
	.venv/bin/python -m benchmarks $(BENCH)

clean:
	$(MAKE) -C native clean
