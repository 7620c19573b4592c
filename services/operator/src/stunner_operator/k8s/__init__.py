"""The operator's only door to Kubernetes: the one package that imports ``kubernetes_asyncio``.

`api` wraps the client, `controller` watches and reconciles, `leader` runs the leader election,
`resources` names the API groups and kinds. An import contract in the workspace pyproject.toml
keeps every other package (of the operator and of the whole workspace) off the client.
"""
