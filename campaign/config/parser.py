"""YAML with line numbers: a parser that refuses repeated keys, validation errors that name file, line and field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from campaign.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

#: Bounds on what a config may cost to read: its size, the nodes it expands to (aliases counted at every use: a
#: 639-byte "billion laughs" file expands to 10^9 nodes) and its nesting.
MAX_YAML_BYTES = 16 << 20
MAX_NODES = 1_000_000
MAX_DEPTH = 100


def _bounded(node: yaml.Node, label: str) -> None:
    """Refuse a document whose expansion (aliases counted where used) or nesting passes the bounds; linear in the
    document's own size (each node is sized once, its aliases reuse the figure)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(node, 1, False)]
    while stack:
        current, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", file=label, line=current.start_mark.line + 1)
        children: list[yaml.Node] = []
        if isinstance(current, yaml.SequenceNode):
            children = list(current.value)
        elif isinstance(current, yaml.MappingNode):
            children = [n for pair in current.value for n in pair]
        if done:
            sizes[id(current)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(current)] > MAX_NODES:
                raise ConfigError(
                    f"expands to more than {MAX_NODES:,} values (aliases are counted each time they are used)",
                    file=label,
                    line=current.start_mark.line + 1,
                    hint="a config this large is a mistake or an attack (an alias bomb); write the values out",
                )
            continue
        if id(current) in sizes:
            continue
        stack.append((current, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a mapping that repeats a key (YAML's last-one-wins would hide a typo)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base constructor gives the proper error
            if first is not None:
                raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(key)
        self.key, self.first, self.line = key, first, line


def parse_yaml(text: str, label: str) -> Any:
    """The document in ``text``, read within the bounds above (size, expansion, nesting), or a ``ConfigError``."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"the file is {len(text):,} bytes, more than {MAX_YAML_BYTES:,}", file=label)
    loader = _UniqueKeyLoader(text)  # a SafeLoader subclass: no arbitrary objects
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _bounded(node, label)
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", file=label) from None
    except _DuplicateKey as e:
        raise ConfigError(
            f"duplicate key (first given on line {e.first}); YAML would silently keep only the last one",
            file=label,
            line=e.line,
            field=str(e.key),
            hint="remove one of the two",
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"invalid YAML: {problem}", file=label, line=line) from None
    finally:
        loader.dispose()


def validate(
    model: type[M], data: Any, text: str, label: str, prefix: Sequence[str] = (), context: dict[str, Any] | None = None
) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [*prefix, *(p for p in err["loc"] if not (isinstance(p, str) and p in {"local", "ssh", "slurm"}))]
        field = ".".join(str(p) for p in loc) or None
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling)"
        elif err["type"] == "missing":
            msg = "this field is required"
        elif err["type"] in ("union_tag_not_found", "union_tag_invalid"):
            msg = "say which kind of host this is: kind: local, ssh or slurm"
        more = len(e.errors()) - 1
        if more:
            msg += f" (and {more} more error{'s' if more > 1 else ''})"
        raise ConfigError(msg, file=label, line=line_of(text, loc), field=field) from None


def line_of(text: str, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (or its nearest existing parent)."""
    try:
        node: yaml.Node | None = yaml.compose(text)
    except yaml.YAMLError:
        return None
    best = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                    best = k.start_mark.line + 1
                    node = v
                    break
            else:
                return best
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best
