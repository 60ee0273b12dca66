"""The one error tree of campaign.

Every error that crosses a module boundary is a ``CampaignError``. Foreign exceptions (paramiko, httpx,
OSError, yaml, pydantic) are mapped at the edge where they occur, with ``raise ... from``, so callers catch
one family and the CLI maps each branch to an exit code::

    CampaignError                      exit 2 unless a subclass says otherwise
    ├── UsageError                     bad command-line usage (unknown variant, bad --set)
    ├── ConfigError                    an experiment or recipe file is invalid: file, line, field, what to do
    ├── HostError                      a host could not be reached or a command on it failed to run
    │   ├── HostKeyError               the host's key is unknown or does not match (never silently accepted)
    │   ├── HostTimeout                a remote call ran past its timeout
    │   └── HostLost                   a lost connection stayed lost for the whole reconnect budget
    ├── LockHeld                       another campaign holds the host's lock (names the run holding it)
    ├── DirtyHost                      a stop could not make the box clean (group alive, port held, GPU memory held)
    ├── StoreError                     the run store is unreadable or a run id is unknown
    ├── BenchError                     a benchmark could not run at all (not: requests that failed; those are data)
    ├── ParkError                      a server would not park or wake (the restore then relaunches it cold)
    ├── RestoreFailed                  exit 3: the known-good could not be relaunched and proven
    └── BoxUnproven                    exit 3: an error ended a run after a launch; nobody proved what runs now

``exit_code`` on each class is what the CLI returns when that error ends a command.
"""

from __future__ import annotations


class CampaignError(Exception):
    """Base of every error campaign raises on purpose."""

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(CampaignError):
    """The command line asks for something that does not exist or cannot be combined."""


class ConfigError(CampaignError):
    """An experiment or recipe file is invalid.

    ``location`` is ``file:line`` when the line is known, so an editor can jump to it.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.detail = message
        where = file or "<config>"
        if line is not None:
            where = f"{where}:{line}"
        prefix = f"{where}: " if file or line is not None else ""
        at = f"{field}: " if field else ""
        super().__init__(f"{prefix}{at}{message}", hint=hint)


class HostError(CampaignError):
    """A host could not be reached, or a command on it could not be run."""


class HostKeyError(HostError):
    """The host key is unknown or changed; campaign refuses to connect rather than trust it."""


class HostTimeout(HostError):
    """A remote call ran past its timeout."""


class HostLost(HostError):
    """A lost connection could not be re-established within its reconnect budget: the host is gone for now."""


class LockHeld(CampaignError):
    """Another campaign holds this host's lock."""

    def __init__(self, message: str, *, holder: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.holder = holder


class DirtyHost(CampaignError):
    """A stop could not bring the box to a clean state."""

    exit_code = 3


class StoreError(CampaignError):
    """The run store is unreadable, or a run or attempt id is unknown."""


class BenchError(CampaignError):
    """A benchmark could not be run at all (failed requests inside a run are data, not this)."""


class ParkError(CampaignError):
    """A server refused (or did not answer) a park or wake; the message says which call and the server's words."""


class RestoreFailed(CampaignError):
    """The known-good configuration could not be relaunched and proven healthy."""

    exit_code = 3


class BoxUnproven(CampaignError):
    """An error (a host lost for good, say) ended a run after a server was launched: the box is not proven."""

    exit_code = 3
