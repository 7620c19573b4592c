LISTENER: int
RELAY: int
BATCH: int

class FastRelay:
    def fileno(self) -> int: ...
    def watch(
        self,
        fd: int,
        kind: int,
        slot: int,
        max_stun_bytes: int = 0,
        max_datagram_bytes: int = 0,
        /,
    ) -> None: ...
    def answer_binding(self, listener_fd: int, software: bytes, /) -> None: ...
    def answer_challenges(self, listener_fd: int, template: bytes, valid_s: float, /) -> None: ...
    def challenge_budget(
        self, listener_fd: int, rate_per_s: float, burst: float, sources: int, /
    ) -> None: ...
    def challenge_allow(self, listener_fd: int, host: str, /) -> bool: ...
    def unwatch(self, fd: int, /) -> None: ...
    def forget(self, fd: int, /) -> None: ...
    def add_client_route(
        self,
        listener_fd: int,
        client_host: str,
        client_port: int,
        channel: int,
        relay_fd: int,
        peer_host: str,
        peer_port: int,
        cluster_slot: int,
        /,
    ) -> None: ...
    def add_peer_route(
        self,
        relay_fd: int,
        peer_host: str,
        peer_port: int,
        channel: int,
        listener_fd: int,
        client_host: str,
        client_port: int,
        cluster_slot: int,
        /,
    ) -> None: ...
    def remove_client_route(
        self, listener_fd: int, client_host: str, client_port: int, channel: int, /
    ) -> None: ...
    def remove_peer_route(
        self, relay_fd: int, peer_host: str, peer_port: int, channel: int, /
    ) -> None: ...
    def lookup_client_route(
        self, listener_fd: int, client_host: str, client_port: int, channel: int, /
    ) -> tuple[int, tuple[str, int], int] | None: ...
    def lookup_peer_route(
        self, relay_fd: int, peer_host: str, peer_port: int, channel: int, /
    ) -> tuple[int, tuple[str, int], int] | None: ...
    def poll(self) -> list[tuple[int, bytes, tuple[str, int]]]: ...
    def take_counters(self) -> list[tuple[int, int, int, int, int]]: ...
    def take_drops(self, listener_fd: int, /) -> tuple[int, int, int]: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
