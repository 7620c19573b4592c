"""Common building blocks of the Kubernetes object models: metadata, references, conditions.

The operator reads objects written by users and by other controllers, so every model accepts
and keeps fields it does not know (``extra="allow"``) and uses the camelCase names of the API.
Models are frozen: the renderer treats its inputs as values and never mutates them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


def _stringify_values(value: Any) -> Any:
    # YAML turns `key: true` into a bool; Kubernetes maps are string to string, and manifests
    # copied from the docs carry unquoted booleans and numbers, so accept and stringify them.
    if isinstance(value, dict):
        return {str(k): _scalar_text(v) for k, v in value.items()}
    return value


def _scalar_text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


StrMap = Annotated[dict[str, str], BeforeValidator(_stringify_values)]


class K8sModel(BaseModel):
    """Base of every object model: camelCase aliases, unknown fields kept, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        frozen=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        # The API server writes an empty list or map as null (an EndpointSlice without ready
        # endpoints has "endpoints": null): a known field given null takes its default.
        if isinstance(data, dict) and None in data.values():
            known = {name for name in cls.model_fields} | {
                f.alias for f in cls.model_fields.values() if f.alias
            }
            return {k: v for k, v in data.items() if v is not None or k not in known}
        return data


class OwnerReference(K8sModel):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(K8sModel):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    resource_version: str = ""
    labels: StrMap = Field(default_factory=dict)
    annotations: StrMap = Field(default_factory=dict)
    owner_references: tuple[OwnerReference, ...] = ()


class LabelSelectorRequirement(K8sModel):
    key: str
    operator: str
    values: tuple[str, ...] = ()


class LabelSelector(K8sModel):
    match_labels: StrMap = Field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        """Kubernetes label-selector semantics; an unknown operator matches nothing."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "In":
                ok = present and labels[req.key] in req.values
            elif req.operator == "NotIn":
                ok = not present or labels[req.key] not in req.values
            elif req.operator == "Exists":
                ok = present
            elif req.operator == "DoesNotExist":
                ok = not present
            else:
                ok = False
            if not ok:
                return False
        return True


class Condition(K8sModel):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    observed_generation: int = 0
    last_transition_time: str = ""


class K8sObject(K8sModel):
    """Any top-level object: apiVersion, kind and metadata."""

    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace
