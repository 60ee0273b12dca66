"""campaign's reference server: an OpenAI-compatible server over a tiny trained MLA arithmetic model.

Run it with ``python -m campaign.refserver``. This package (and ``mla_kernels``) is the only part of campaign that
imports torch; the orchestrator launches it as a process and never imports it.
"""
