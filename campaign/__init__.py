"""campaign: run inference-optimization campaigns against LLM servers on local or SSH hosts."""

from typing import Any


def __getattr__(name: str) -> Any:
    # ``campaign.__version__`` asks git (campaign.version), so only a caller that reads it pays for that.
    if name == "__version__":
        from campaign.version import version

        return version()
    raise AttributeError(f"module 'campaign' has no attribute {name!r}")
