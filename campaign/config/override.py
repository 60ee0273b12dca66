"""``--set key.path=value``: one override applied to an experiment file's raw data before validation."""

from __future__ import annotations

from typing import Any

import yaml

from campaign.errors import UsageError


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``--set key.path=value`` to raw experiment data (value parsed as YAML; list indexes allowed)."""
    if "=" not in item:
        raise UsageError(f"--set {item!r}: expected key.path=value", hint="e.g. --set timeouts.ready_s=30")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    if not all(parts):
        raise UsageError(f"--set {item!r}: empty key segment")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise UsageError(f"--set {item!r}: {'.'.join(parts[: i + 1])} is not an index of a list of {len(node)}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise UsageError(f"--set {item!r}: {'.'.join(parts[:i])} is a value, not a mapping")
