# The commands the README gives.
.PHONY: demo test test-lowest lock example lint bench
demo:
	./scripts/demo
test:
	./scripts/test
test-lowest:
	./scripts/test-lowest
lock:
	./scripts/lock
example:
	./scripts/example
lint:
	.venv/bin/ruff check src tests benchmarks && .venv/bin/ruff format --check src tests benchmarks && .venv/bin/mypy && .venv/bin/lint-imports --no-cache
bench:
	.venv/bin/fairlane bench
