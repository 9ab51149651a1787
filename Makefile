# The quick start: `make run` (set up and serve on embedded defaults), `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run demo-password test install lint format bench bench-render migrate clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# What the product needs to run; the dev extras (tests, linters) come with `make test`.
$(VENV)/.runtime: pyproject.toml constraints.txt | $(BIN)/activate
	$(BIN)/pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# A migration may rewrite a large table in one statement: no bound on its wait.
migrate: $(VENV)/.runtime
	DATABASE_WAIT_TIMEOUT=0 $(BIN)/python manage.py migrate --noinput

run: migrate
	$(BIN)/python manage.py collectstatic --noinput -v0
	$(BIN)/python manage.py ensure_demo_user
	@echo "Starting the server for http://$(HOST):$(PORT)/ (the admin is at /admin/);"
	@echo "it is up when Daphne logs 'Listening on TCP address $(HOST):$(PORT)'."
	DAPHNE_LOG_LEVEL=INFO $(BIN)/daphne -b $(HOST) -p $(PORT) chatsite.asgi:application

# The demo user's password is stored hashed: this sets a new one and prints it.
demo-password: migrate
	$(BIN)/python manage.py ensure_demo_user --reset-password

# Three workers (pytest-xdist) by default: most tests wait on servers and browsers, so
# they overlap well even on two cores. tests/e2e is one unit on one worker (one Chromium at
# a time) and the longest: the other two share the rest in about its time.
# TEST_WORKERS=0 runs in this process only.
TEST_WORKERS ?= 3

test: lint
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python -m pytest -p tests.support.workers -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# Style, types, the layers and their import contracts, declared dependencies.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/deptry .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python -m bench $(BENCH_ARGS)

# The chat page in Chromium while a 50,000-character answer streams (docs/performance.md).
bench-render: install
	$(BIN)/python -m bench.rendering $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var staticfiles test-artifacts
