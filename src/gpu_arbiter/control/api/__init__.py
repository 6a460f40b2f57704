"""The REST API (FastAPI; OpenAPI at /openapi.json, docs at /docs).

Writes go to the control loop (`loop.py`) and are answered after their transaction commits;
reads go straight to the database, which the loop keeps current. Every route but /healthz and
/metrics needs `Authorization: Bearer <token>`; a team token sees only its team's jobs, and a
job it may not see is answered exactly like one that does not exist. Agent tokens reach the
node endpoints only. /metrics shows per-team series only to a token that may see the team
(or to anyone with `public_metrics`).

Errors, each documented in the OpenAPI schema: a bad body, path or query → 422 naming the
field (`{"detail": "body.gpus: ...", "errors": [...]}`), a refused job (e.g. larger than the
cluster) → 422 with the engine's message and `errors: []`, a body that is not even text → 400,
a body not declared JSON → 415, no or bad token → 401, too many bad tokens from one address →
429 with Retry-After, not allowed → 403, unknown → 404, wrong method → 405, state clash → 409,
no nodes yet → 503. Every other error answers `{"detail": "..."}`.

One module per question; `app.create_api` puts them together:
- `deps`: who is calling (the bearer token, by role) and the parameters every router shares;
- `problems`: what an error answer looks like, and which exception gets which status;
- `middleware`: what happens to a request before routing (415, the submit fast lane, timing);
- one router per resource, each with its OpenAPI tag: `status` (is the server up, its
  metrics, who am I), `jobs`, `telemetry`, `nodes` (the agents' endpoints and cordons),
  `drain`, `teams` (and quotas), `tokens`, `economy` (prices, ledger, bills), `records`
  (the audit log and the job history).
"""
