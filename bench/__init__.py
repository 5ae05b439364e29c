"""The bench: batching configurations measured on a real TorchServe or our standalone server (`python
bench/compare.py`, `--hosts`), peers beside them, and standalone in-process probes; over the handler (`bucketing`),
the archive builder (`model_store`) and the TorchServe control module (`tsctl`), none of which imports anything of
the bench.

Its rooms, one sub-package each, stand on floors. A module imports from its own room, from a room on a lower floor,
and from outside the bench; never from a higher floor, nor from another room on its own floor. Bottom to top:

1. `inputs/`: what is measured: the generated workloads and the user's texts (`workloads`, `traffic`), the bench
   models (`models`), a configuration and its resolved job (`configuration`, `job`), the float32 references answers
   are checked against (`references`), and the handler's engine registry as the bench reads it (`engines`).
2. `peers/`: other servers measured on the same loads: `PEERS` (in `__init__`), one module a peer (`infinity`,
   `litserve`), what a peer kind is (`kind`), a running peer (`server`); their server scripts in `servers/` and
   pinned requirements in `requirements/`.
3. `harness/`: one compare run: flags (`options`), the run plan and suites (`run_plan`), configurations into jobs
   (`jobs`), load and measurement (`load`, `measure`, `capacity`, `stats`), the targets (`targets`), results,
   report and plots (`results`, `report`, `plots`), and the run's in-process figures (`roofline`,
   `exact_length`, `offline`, `worker_memory`).
4. `kinds/`, `hosts/` and `probes/`, side by side (none imports another):
   - `kinds/`: the run kinds (`RUN_KINDS`; `context.RunKind`, `context.RunContext`): `matrix`, `tune` (with
     `tune_search`, `tune_choice`, `tune_report`, `tune_calibration`), `bulk`, `long`.
   - `hosts/`: the hosts our worker is measured on, `--hosts` (`HOSTS` in `__init__`; `host.Host`, `host.HostRun`),
     one module a host: `torchserve`, `standalone`. The run kinds reach them only through `RunContext.target`.
   - `probes/`: standalone in-process tools, each `python -m bench.probes.NAME`: `answer_cost`,
     `attention_export`, `bf16`, `engine_cost`, `long_texts`, `memory`, `pass_cost` (with `pass_timing` and
     `engine_cuts`), `tokenize_cost`.
5. `compare.py`: the command line, the one module that reads the harness, `kinds.RUN_KINDS` and `hosts.HOSTS`
   together.

Every import is a plain static `import` statement; a few are inside functions (deferred for start-up time: torch,
transformers and the handler where only one path needs them), never computed by name.
"""
