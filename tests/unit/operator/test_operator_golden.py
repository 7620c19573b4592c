"""Golden tests: every YAML example of the Gateway API reference renders to the checked-in output.

The YAML examples of upstream's GATEWAY.md and GATEWAY-v1alpha1.md
(https://github.com/l7mp/stunner/tree/main/docs) are kept one per file in
tests/fixtures/operator/seeds/; where copies of those documents sit beside the checkout
(../shared/seeds), a test checks the kept examples against them, else it skips. Each renders on
top of ``base.yaml`` (the objects
the examples refer to). Expected output lives in tests/fixtures/operator/golden/; set
UPDATE_GOLDENS=1 to rewrite it after a deliberate change, and review the diff.
"""

from __future__ import annotations

import json
import os
import random
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from stunner_common.config import StunnerConfig
from stunner_operator.render.engine import Renderer
from stunner_operator.render.store import key_of
from support.operator import FIXTURES, objects_from_yaml, snapshot

SEEDS = FIXTURES / "seeds"
GOLDEN = FIXTURES / "golden"
_BLOCK = re.compile(r"^([ \t]*)```yaml\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def yaml_examples(path: Path) -> list[tuple[str, str]]:
    """The manifests of a Markdown file; blocks that show an object's status are illustrations."""
    out = []
    text = path.read_text()
    for i, match in enumerate(_BLOCK.finditer(text)):
        body = textwrap.dedent(match.group(2))
        body = re.sub(r"^EOF\s*$", "", body, flags=re.MULTILINE)  # a stray heredoc marker
        if re.search(r"^status:", body, flags=re.MULTILINE):
            continue
        out.append((f"{path.stem}-{i:02d}", body))
    return out


SEED_DOCS = Path(__file__).resolve().parents[3].parent / "shared" / "seeds"
CASES = [(p.stem, p.read_text()) for p in sorted(SEEDS.glob("GATEWAY*.yaml"))]
BASE = (SEEDS / "base.yaml").read_text()


def test_the_kept_examples_are_those_of_the_seed_documents() -> None:
    docs = [SEED_DOCS / "GATEWAY.md", SEED_DOCS / "GATEWAY-v1alpha1.md"]
    if not all(d.is_file() for d in docs):
        pytest.skip("the seed documents are not beside this checkout (../shared/seeds)")
    extracted = [case for doc in docs for case in yaml_examples(doc)]
    assert [(name, text.rstrip("\n") + "\n") for name, text in extracted] == CASES


def test_the_seed_documents_hold_the_expected_number_of_examples() -> None:
    names = [name for name, _ in CASES]
    assert len([n for n in names if re.fullmatch(r"GATEWAY-\d+", n)]) == 11
    assert len([n for n in names if n.startswith("GATEWAY-v1alpha1-")]) == 4


@pytest.mark.parametrize(("name", "text"), CASES, ids=[c[0] for c in CASES])
def test_seed_example_renders_to_its_golden_output(name: str, text: str) -> None:
    example = objects_from_yaml(text)
    assert example, f"{name} holds no object"
    renderer = Renderer()
    renderer.apply([*objects_from_yaml(BASE), *example])
    got = snapshot(renderer)
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDENS"):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(golden.read_text())


def test_rendering_is_byte_identical_whatever_the_input_order() -> None:
    docs = objects_from_yaml(BASE)
    for _name, text in CASES:
        docs.extend(objects_from_yaml(text))
    outputs = set()
    rng = random.Random(7)
    for _ in range(5):
        shuffled = list(docs)
        rng.shuffle(shuffled)
        renderer = Renderer()
        # An example replaces the base object of the same key: keep only the last version.
        latest = {key_of(o): o for o in docs}
        renderer.apply([o for o in shuffled if latest[key_of(o)] is o])
        outputs.add(json.dumps(snapshot(renderer), sort_keys=True))
    assert len(outputs) == 1


def test_worked_example_of_the_reference_renders_the_documented_config(fixtures_dir: Path) -> None:
    folder = fixtures_dir / "worked-example"
    renderer = Renderer()
    renderer.apply(objects_from_yaml((folder / "input.yaml").read_text()))
    # Validated as-is: parse_config would expand $STUNNER_ADDR, which stunnerd does later.
    expected = StunnerConfig.model_validate(
        json.loads((folder / "expected-config.json").read_text())
    )
    configs = renderer.configs()
    assert list(configs) == ["stunner/udp-gateway"]
    assert configs["stunner/udp-gateway"].canonical_json() == expected.canonical_json()


def test_worked_example_side_outputs_match_the_reference(fixtures_dir: Path) -> None:
    renderer = Renderer()
    renderer.apply(objects_from_yaml((fixtures_dir / "worked-example" / "input.yaml").read_text()))
    gw = renderer.gateway("stunner", "udp-gateway")
    assert gw is not None
    assert gw.service is not None
    assert gw.deployment is not None
    svc = gw.service
    assert svc["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
        "stunner.l7mp.io/enable-mixed-protocol-lb": "true",
        "stunner.l7mp.io/related-gateway-name": "stunner/udp-gateway",
    }
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["sessionAffinity"] == "ClientIP"
    assert [(p["name"], p["protocol"], p["port"]) for p in svc["spec"]["ports"]] == [
        ("udp-listener", "UDP", 3478),
        ("tcp-listener", "TCP", 3478),
    ]
    container = gw.deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "l7mp/stunnerd:1.2.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert gw.deployment["spec"]["replicas"] == 1
    status = gw.status
    assert status is not None
    assert status.addresses == (("IPAddress", "34.1.2.3"),)
    assert [c.reason for c in status.conditions] == ["Accepted", "Programmed"]
    route = renderer.statuses()[("UDPRoute", "stunner", "media-plane")].to_k8s()
    assert route["parents"][0]["parentRef"] == {"name": "udp-gateway"}
    assert [c["reason"] for c in route["parents"][0]["conditions"]] == ["Accepted", "ResolvedRefs"]


def test_every_seed_example_parses_as_yaml() -> None:
    for name, text in CASES:
        assert list(yaml.safe_load_all(text)), name
