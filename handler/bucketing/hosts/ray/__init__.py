"""The Ray Serve host: the same worker as TorchServe's handler, one opened worker per replica, behind an HTTP ingress
over the shared route table (`bucketing.hosts.routes`, `bucketing.hosts.rows`). docs/hosts/ray.md.

- `batching`: what a request to a replica carries (its estimated tokens among it), and the replicas' queue signals
  summed per model; a replica batches with the standalone host's batcher (by requests, tokens and delay, when its
  worker is free);
- `args`: the application's args, parsed and checked before any replica starts;
- `board`: the replicas' queue signals, gathered for the ingress's `/metrics`;
- `front`: the HTTP answers (authorization, body limit, routes, TorchServe's error bodies), no Ray in it;
- `app`: the Ray Serve deployments (one per model, and the ingress) and the application builder that `serve run`,
  `serve deploy` and KubeRay's `RayService` name (`bucketing.hosts.ray.app:build`);
- `drain`: the driver that drains the ingress before a cluster stops (`make stop`, a head pod's `preStop`).

Nothing below `bucketing.hosts` imports it, and no archive carries it (model_store.archives.NOT_ARCHIVED).
"""
