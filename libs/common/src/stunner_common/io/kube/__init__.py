"""The Kubernetes API: where the credentials come from (``config``: a kubeconfig as kubectl reads
it, or the pod's service account), the one API client (``KubeApi``), and the port-forward that
finds the CDS and stunnerd pods from a laptop (``forward``)."""

from stunner_common.io.kube import forward
from stunner_common.io.kube.forward import *  # noqa: F403  (its __all__)

__all__ = [*forward.__all__]
