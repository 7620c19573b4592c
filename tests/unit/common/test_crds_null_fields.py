"""The API server writes empty lists and maps as null; the models take their defaults."""

from __future__ import annotations

from stunner_common.crds import parse_object
from stunner_common.crds.core import EndpointSlice


def test_an_endpoint_slice_with_null_endpoints_parses_as_empty() -> None:
    obj = parse_object(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "svc-abcde", "namespace": "ns", "labels": None},
            "addressType": "IPv4",
            "endpoints": None,
            "ports": None,
        }
    )
    assert isinstance(obj, EndpointSlice)
    assert obj.endpoints == ()
    assert obj.metadata.labels == {}


def test_null_in_an_unknown_field_is_kept_as_given() -> None:
    obj = parse_object(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": "ns"},
            "immutable": None,
        }
    )
    assert obj.model_extra == {"immutable": None}
