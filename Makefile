# The two commands a newcomer needs (README): `make run` and `make test`.
# Both install what a fresh machine lacks first (scripts/setup.sh is idempotent and quick when done).
.PHONY: run test lint setup tracer bench clean

run: setup
	.venv/bin/heapcast run --quick

test: setup lint
	scripts/engine.sh up
	.venv/bin/python -m pytest -q

setup:
	scripts/setup.sh

# ruff: lint and format check over the whole tree (pyproject.toml [tool.ruff])
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

tracer:
	$(MAKE) -C native

bench: setup
	.venv/bin/python benchmarks/bench_tracer.py
	.venv/bin/python benchmarks/bench_convert.py
	.venv/bin/python benchmarks/bench_train.py

clean:
	$(MAKE) -C native clean
