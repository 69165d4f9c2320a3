# The two commands a newcomer needs (README): `make run` and `make test`.
# Both install what a fresh machine lacks first (scripts/setup.sh is idempotent and quick when done).
.PHONY: run test setup tracer bench clean

run: setup
	.venv/bin/heapcast run --quick

test: setup
	scripts/engine.sh up
	.venv/bin/python -m pytest -q

setup:
	scripts/setup.sh

tracer:
	$(MAKE) -C native

bench: setup
	.venv/bin/python benchmarks/bench_tracer.py
	.venv/bin/python benchmarks/bench_convert.py
	.venv/bin/python benchmarks/bench_train.py

clean:
	$(MAKE) -C native clean
