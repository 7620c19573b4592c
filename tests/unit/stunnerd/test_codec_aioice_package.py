"""The codec takes `aioice.stun` without aioice's package body (its ICE stack: dnspython,
ifaddr), and aioice stays whole for any other user in the same process.

Each case runs in a fresh interpreter: `sys.modules` of the test process has seen everything.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = {
    "the codec alone loads no ICE stack": (
        "import sys, stunnerd.turn.codec\n"
        "assert not {'dns', 'ifaddr', 'aioice.ice'} & set(sys.modules), sorted(sys.modules)\n"
    ),
    "a submodule imported afterwards, then a name of the package": (
        "import stunnerd.turn.codec, aioice.ice, aioice\n"
        "assert aioice.Connection is aioice.ice.Connection\n"
        "assert aioice.__version__\n"
    ),
    "a name of the package first": (
        "import stunnerd.turn.codec\n"
        "from aioice import Candidate, Connection, stun\n"
        "import aioice, stunner_common.stun as ours\n"
        "assert aioice.stun is stun and ours._aioice is stun\n"
        "assert sorted(aioice.__all__) == ['Candidate', 'Connection', 'ConnectionClosed', "
        "'TransportPolicy']\n"
    ),
    "aioice's TURN client beside the codec": (
        "import stunnerd.turn.codec\n"
        "from aioice.turn import create_turn_endpoint\n"
        "from aioice import stun\n"
        "assert stun.Message(stun.Method.BINDING, stun.Class.REQUEST).transaction_id\n"
    ),
}


@pytest.mark.parametrize("code", CASES.values(), ids=list(CASES))
def test_aioice_is_whole_for_its_users_and_the_codec_loads_no_ice(code: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
