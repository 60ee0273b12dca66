"""Where commands run: the Host protocol and its implementations (local, SSH)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from campaign.hosts.base import Host, Result

if TYPE_CHECKING:
    from campaign.config import LocalHostConfig, SlurmHostConfig, SSHHostConfig

__all__ = ["Host", "Result", "open_host"]


def open_host(config: LocalHostConfig | SSHHostConfig | SlurmHostConfig, *, accept_new_host_key: bool = False) -> Host:
    """Connect to the host an experiment names (paramiko is imported only for SSH hosts)."""
    if config.kind == "local":
        from campaign.hosts.local import LocalHost

        return LocalHost()
    if config.kind == "slurm":
        from campaign.hosts.local import LocalHost
        from campaign.hosts.slurm import SlurmHost

        return SlurmHost(
            LocalHost(),
            partition=config.partition,
            sbatch_args=tuple(config.sbatch_args),
            slurm_conf=config.slurm_conf,
            start_timeout_s=config.start_timeout_s,
        )
    from campaign.hosts.ssh import SSHHost, SSHTarget

    return SSHHost.open(
        SSHTarget(
            host=config.host,
            user=config.user,
            port=config.port,
            key=config.key,
            known_hosts=config.known_hosts,
            accept_new_host_key=config.accept_new_host_key or accept_new_host_key,
            ssh_config=config.ssh_config,
            connect_timeout=config.connect_timeout,
        )
    )
