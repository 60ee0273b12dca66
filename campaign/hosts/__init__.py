"""Where commands run: the Host protocol and its implementations (local, SSH)."""

from campaign.hosts.base import Host, Result

__all__ = ["Host", "Result"]
