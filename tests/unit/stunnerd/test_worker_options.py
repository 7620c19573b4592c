"""A worker process's options: the command line the supervisor writes (`Worker`) reads back, in
the worker's edge (`stunnerd.worker_main`), as the one `ChildOptions` its `serve` runs with."""

from __future__ import annotations

from stunnerd.net.guard import ClientLimits, ConnectionLimits
from stunnerd.net.server import ServerOptions
from stunnerd.net.tuning import ServerTuning
from stunnerd.worker_main import build_parser, child_options
from stunnerd.workers.child import ChildOptions
from stunnerd.workers.pool import WorkerPool
from stunnerd.workers.worker import Worker

TUNING = ServerTuning(udp_gso=False, client_idle_timeout_s=7.5, socket_close_timeout_s=0.25)
LIMITS = ClientLimits(connection=ConnectionLimits(max_per_source=3))


def test_the_supervisors_command_line_reads_back_as_the_options_it_meant() -> None:
    worker = Worker(
        2,
        "127.0.0.1",
        "all:DEBUG",
        tuning=TUNING,
        limits=LIMITS,
        relay_addresses=("10.0.0.5", "fd00::5"),
        node_address="10.1.2.3",
    )
    argv = [*worker._argv[3:], "--fd-channel", "7"]  # what Worker.start adds
    assert child_options(build_parser().parse_args(argv)) == ChildOptions(
        index=2,
        bind_host="127.0.0.1",
        relay_addresses=("10.0.0.5", "fd00::5"),
        node_address="10.1.2.3",
        tuning=TUNING,
        limits=LIMITS,
        log_override="all:DEBUG",
        fd_channel=7,
    )


def test_a_worker_told_to_keep_no_journal_reads_it_back_and_journals_by_default() -> None:
    quiet = Worker(1, "127.0.0.1", None, journal=False)
    argv = [*quiet._argv[3:], "--fd-channel", "7"]
    assert child_options(build_parser().parse_args(argv)).journal is False
    default = Worker(1, "127.0.0.1", None)
    assert "--no-journal" not in default._argv
    assert child_options(build_parser().parse_args(default._argv[3:])).journal is True


def test_a_bare_command_line_is_the_default_options() -> None:
    assert child_options(build_parser().parse_args([])) == ChildOptions()


def test_a_workers_server_shares_each_port_with_the_others_and_relays_no_tcp() -> None:
    options = ChildOptions(
        index=1,
        bind_host="::",
        relay_addresses=("10.0.0.5",),
        node_address="10.1.2.3",
        tuning=TUNING,
        limits=LIMITS,
    )
    assert options.server_options() == ServerOptions(
        bind_host="::",
        relay_addresses=("10.0.0.5",),
        node_address="10.1.2.3",
        reuse_port=True,
        tcp_relays=False,
        tuning=TUNING,
        limits=LIMITS,
    )


def test_the_supervisors_libbpf_reaches_every_worker_on_its_command_line() -> None:
    pool = WorkerPool(2, libbpf="/opt/lib/libbpf.so.1")
    for worker in pool.workers:
        assert worker._argv[-2:] == ["--libbpf", "/opt/lib/libbpf.so.1"]
        assert build_parser().parse_args(worker._argv[3:]).libbpf == "/opt/lib/libbpf.so.1"
    assert "--libbpf" not in WorkerPool(1).workers[0]._argv
