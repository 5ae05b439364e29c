"""The model kinds' task classes, one package or module per kind (embedding, classification, sparse, multivector),
each owning its task, folder reader and engine hooks, above the engines and the model they load; `task` holds what
the pipeline reads of a task (`Task`) and the hooks' defaults (`TaskHooks`).

The registry of the kinds (`Kind`, `MODEL_KINDS`, `KindName`) is pure and lives on the ground floor:
`bucketing.model_kinds`.
"""
