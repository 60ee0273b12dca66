"""campaign: run inference-optimization campaigns against LLM servers on local or SSH hosts."""

__version__ = "0.1.0"
