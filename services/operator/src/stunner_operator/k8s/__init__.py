"""The operator's door to the Kubernetes API: `api` is the client, `resources` names the API
groups, kinds and paths. What the operator does with the cluster (watch, reconcile, elect a
leader) is `stunner_operator.controller`."""
