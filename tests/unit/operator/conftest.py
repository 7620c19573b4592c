"""Fixtures of the operator unit tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stunner_common.crds import K8sObject
from stunner_operator.render.engine import Renderer
from stunner_operator.render.options import RenderOptions
from support.operator import FIXTURES, objects_from_yaml


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def render() -> Callable[..., Renderer]:
    """``render(yaml_text, *more_texts, options=None)`` -> a Renderer holding the result."""

    def _render(*texts: str, options: RenderOptions | None = None) -> Renderer:
        renderer = Renderer(options)
        objs: list[K8sObject] = []
        for text in texts:
            objs.extend(objects_from_yaml(text))
        renderer.apply(objs)
        return renderer

    return _render
