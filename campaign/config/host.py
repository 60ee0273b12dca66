"""Host entries of an experiment file: this machine, a machine over SSH, or a Slurm cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from campaign.config.fields import Strict, env_names
from campaign.records import KnobValue


class _HostBase(Strict):
    """What every kind of host entry may say besides how to reach it."""

    workdir: str = "~/.campaign"
    #: campaign's state folder on the host (its lock and current.json); None: ``lock.host_state_dir()``. Only for
    #: several campaign hosts on one machine (GPU slices of one box, the tests' two sshd): each slice is a box of its
    #: own, and every experiment that uses a slice must name the same folder for it.
    state_dir: str | None = None
    #: Knobs every launch on this host gets, over the baseline's and each variant's (a port, a device of a slice).
    knobs: dict[str, KnobValue] = Field(default_factory=dict)
    #: Environment every launch on this host gets, over the variant's (``CUDA_VISIBLE_DEVICES`` of a slice).
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        return env_names(v)


class LocalHostConfig(_HostBase):
    """Servers run on this machine."""

    kind: Literal["local"] = "local"


class SSHHostConfig(_HostBase):
    """Servers run on a machine reached over SSH (honours ~/.ssh/config aliases, keys, agent, ProxyJump)."""

    kind: Literal["ssh"]
    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    ssh_config: str | None = "~/.ssh/config"
    connect_timeout: float = 10.0


class SlurmHostConfig(_HostBase):
    """Servers run as Slurm batch jobs, submitted from this machine (the login node) to the cluster's scheduler.

    ``workdir`` must be on a filesystem the compute nodes share with this machine: the job's output file, PID and
    exit status are written there and read from here.
    """

    kind: Literal["slurm"]
    partition: str | None = None
    sbatch_args: list[str] = Field(default_factory=list)
    #: A slurm.conf other than the default one (passed as SLURM_CONF to every Slurm command).
    slurm_conf: str | None = None
    #: How long a launch waits for its job to start before cancelling it.
    start_timeout_s: float = Field(default=600.0, gt=0)


HostConfig = LocalHostConfig | SSHHostConfig | SlurmHostConfig
