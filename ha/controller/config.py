"""Controller settings: one frozen dataclass, one validate().

Defaults follow RocketMQ 5's controller mode: a broker is declared inactive
when it has not heartbeaten for 10 s (controllerHeartBeatTimeoutMills), and
enableElectUncleanMaster is false, so a broker set whose SyncStateSet has no
live member stays without a master rather than elect a replica that may lack
acknowledged messages (docs/design.md, "Controller (state machine)").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from store.config import ConfigError


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    # A broker whose last heartbeat is older than this is not alive.
    heartbeat_timeout_ms: int = 10_000
    # Elect any live replica when no SyncStateSet member is alive ("may lose
    # messages": the replica may lack what the master acknowledged).
    enable_elect_unclean_master: bool = False

    def validate(self) -> ControllerConfig:
        if isinstance(self.heartbeat_timeout_ms, bool) or not isinstance(
                self.heartbeat_timeout_ms, int) or self.heartbeat_timeout_ms < 1:
            raise ConfigError(
                f"controller heartbeat timeout must be a whole number of ms >= 1, "
                f"not {self.heartbeat_timeout_ms!r}")
        if not isinstance(self.enable_elect_unclean_master, bool):
            raise ConfigError(
                f"enable_elect_unclean_master must be true or false, "
                f"not {self.enable_elect_unclean_master!r}")
        return self

    def with_(self, **changes: object) -> ControllerConfig:
        return replace(self, **changes).validate()  # type: ignore[arg-type]


PRODUCTION = ControllerConfig()
# A short timeout so tests see a dead master quickly.
TESTING = ControllerConfig(heartbeat_timeout_ms=1_000)
