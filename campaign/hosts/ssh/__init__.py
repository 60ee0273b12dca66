"""SSH hosts: a machine reached over SSH with paramiko (this package is the only one that imports paramiko).

One SSH connection per host carries everything: each ``run`` takes a long-lived remote shell (or a new exec
channel) on the persistent transport, files move over one persistent SFTP session, and ``url(port)`` is a local
listener whose connections become ``direct-tcpip`` channels to ``127.0.0.1:port`` on the remote. Host keys are
always verified. paramiko and socket errors are mapped to ``HostError`` / ``HostKeyError`` / ``HostTimeout`` with a
message that says what to do.

Rooms: ``target`` (the frozen ``SSHTarget`` and ssh_config resolution), ``connect`` (handshake, host keys, the
ProxyJump chain, error mapping), ``reconnect`` (backoff), ``shells`` (the remote shell pool and the exec fallback),
``files`` (SFTP), ``forward`` (port forwarding) and ``host`` (``SSHHost``, the facade that holds them together).
"""

from campaign.hosts.ssh.host import SSHHost
from campaign.hosts.ssh.target import SSHTarget

__all__ = ["SSHHost", "SSHTarget"]
