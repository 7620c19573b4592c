"""Kubernetes mode's control: the watch, render and write loops (`loops`) and the leader election
(`leader`). They reach the cluster only through `stunner_operator.k8s`, the API client and the
resources it knows."""
