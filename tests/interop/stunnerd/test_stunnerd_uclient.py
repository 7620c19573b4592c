"""coturn's turnutils_uclient drives stunnerd over every transport, echoed by turnutils_peer."""

from __future__ import annotations

import re
import subprocess

import pytest

from support.processes import which
from support.stunnerd_process import PASSWORD, SECRET, USER, Stunnerd

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

MESSAGES = 100
SESSIONS = 2


def uclient_binary() -> str:
    binary = which("turnutils_uclient")
    if binary is None:
        pytest.skip("turnutils_uclient (coturn) is not installed")
    return binary


def uclient(args: list[str], timeout_s: float = 60.0) -> str:
    done = subprocess.run(
        [uclient_binary(), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return done.stdout + done.stderr


def uclients(runs: dict[str, list[str]], timeout_s: float = 60.0) -> dict[str, str]:
    """Run several uclients side by side (a light load each); their outputs by name."""
    binary = uclient_binary()
    procs = {
        name: subprocess.Popen(
            [binary, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for name, args in runs.items()
    }
    outputs = {}
    try:
        for name, proc in procs.items():
            outputs[name] = proc.communicate(timeout=timeout_s)[0]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def assert_all_echoed(output: str, label: str = "") -> None:
    tail = f"{label}:\n{output[-3000:]}"
    totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", output, re.M)
    assert totals, tail
    sent, received = map(int, totals[-1])
    assert sent == MESSAGES * SESSIONS, tail
    assert received == sent, tail
    assert "Total lost packets 0 (0.000000%)" in output, tail


TRANSPORTS = {
    "TURN-UDP": [],
    "TURN-TCP": ["-t"],
    "TURN-TLS": ["-t", "-S"],
    "TURN-DTLS": ["-S"],
}


def base_args(server: Stunnerd, proto: str, peer_port: int) -> list[str]:
    return [
        *TRANSPORTS[proto],
        "-p", str(server.ports[proto]),
        "-e", "127.0.0.1", "-r", str(peer_port),
        "-c", "-X", "-m", str(SESSIONS), "-n", str(MESSAGES), "-z", "2", "-l", "100",
    ]  # fmt: skip


def over_every_transport(server: Stunnerd, peer_port: int, extra: list[str]) -> None:
    outputs = uclients(
        {proto: [*base_args(server, proto, peer_port), *extra, "127.0.0.1"] for proto in TRANSPORTS}
    )
    for proto, output in outputs.items():
        assert_all_echoed(output, proto)


def test_uclient_relays_channel_data_over_udp_tcp_tls_and_dtls_with_static_auth(
    stunnerd_static: Stunnerd, udp_echo_peer: int
) -> None:
    over_every_transport(stunnerd_static, udp_echo_peer, ["-u", USER, "-w", PASSWORD])


def test_uclient_relays_send_and_data_indications_over_every_transport(
    stunnerd_static: Stunnerd, udp_echo_peer: int
) -> None:
    over_every_transport(stunnerd_static, udp_echo_peer, ["-s", "-u", USER, "-w", PASSWORD])


def test_uclient_relays_over_every_transport_with_ephemeral_turn_rest_credentials(
    stunnerd_ephemeral: Stunnerd, udp_echo_peer: int
) -> None:
    over_every_transport(stunnerd_ephemeral, udp_echo_peer, ["-W", SECRET, "-u", "alice"])


def test_uclient_with_a_wrong_password_gets_no_allocation(
    stunnerd_static_apart: Stunnerd, udp_echo_peer: int
) -> None:
    args = [*base_args(stunnerd_static_apart, "TURN-UDP", udp_echo_peer), "-u", USER, "-w", "nope"]
    output = uclient([*args, "127.0.0.1"], timeout_s=60)
    assert "error 401" in output or "Cannot complete Allocation" in output, output[-2000:]
    assert not re.search(r"tot_recv_msgs=[1-9]", output), output[-2000:]


def test_uclient_rtp_rtcp_pairs_get_even_ports_and_reservations(
    stunnerd_static: Stunnerd, udp_echo_peer: int
) -> None:
    """Without -c, uclient allocates RTP on an even port (EVEN-PORT with R) and RTCP with the
    RESERVATION-TOKEN it got back."""
    args = [
        "-p", str(stunnerd_static.ports["TURN-UDP"]), "-e", "127.0.0.1", "-r", str(udp_echo_peer),
        "-X", "-m", str(SESSIONS), "-n", str(MESSAGES), "-z", "2", "-l", "100",
        "-u", USER, "-w", PASSWORD,
    ]  # fmt: skip
    assert_all_echoed(uclient([*args, "127.0.0.1"]))


@pytest.mark.parametrize("proto", ["TURN-TCP", "TURN-TLS"])
def test_uclient_relays_over_tcp_allocations_client_to_client(
    stunnerd_static: Stunnerd, proto: str
) -> None:
    """-T: RFC 6062 TCP relays; each client Connects to the other's relayed address, so stunnerd
    both connects out (Connect) and accepts (ConnectionAttempt), then splices data connections."""
    args = [
        *TRANSPORTS[proto], "-T",
        "-p", str(stunnerd_static.ports[proto]),
        "-X", "-m", str(SESSIONS), "-n", str(MESSAGES // 2), "-z", "2", "-l", "100",
        "-u", USER, "-w", PASSWORD, "127.0.0.1",
    ]  # fmt: skip
    output = uclient(args)
    tail = f"{proto}:\n{output[-3000:]}"
    totals = re.findall(r"tot_send_msgs=(\d+), tot_recv_msgs=(\d+)\s*$", output, re.M)
    assert totals, tail
    sent, received = map(int, totals[-1])
    assert sent == MESSAGES, tail  # -m pairs of clients, -n messages each way per client
    assert received == sent, tail
    assert "Total lost packets 0 (0.000000%)" in output, tail
