"""A value of the wrong shape for its setting, said in the user's terms.

OmegaConf's words for a list given to a mapping ("Cannot merge DictConfig with ListConfig"), a
number given to a mapping ("int is not a subclass of WarmStartConfig") or a word given to a list
("str is not a ListConfig, list or tuple") name neither what the setting takes nor what to write.
Here the setting's node in the composed config says what it takes, and the line says what to
write instead: a list for a mapping whose one list field is what was meant
(`hpo.warm_start=[...]` is `hpo.warm_start.studies=[...]`), brackets around a value for a list.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig


def shape_of(value: Any) -> str:
    """What a value is, in a word a user would use."""
    if isinstance(value, (dict, DictConfig)):
        return "a mapping"
    if isinstance(value, (list, tuple, ListConfig)):
        return "a list"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return "a string"


def wrong_shape(key: str, given: Any, given_text: str, node: Any) -> str | None:
    """One line for `key=given_text` when `given` does not have the shape of the setting's
    current `node` (None when it does, or when the node does not say)."""
    if isinstance(node, DictConfig):
        return _for_mapping(key, given, given_text, node)
    if isinstance(node, ListConfig) and not isinstance(given, (list, tuple)):
        head = f"{key}={given_text}: {key} takes a list, not {shape_of(given)}"
        return f"{head}; write {key}=[{given_text}]"
    if node is not None and isinstance(given, (dict, list, tuple)):
        return f"{key}={given_text}: {key} takes {shape_of(node)}, not {shape_of(given)}"
    return None


def _for_mapping(key: str, given: Any, given_text: str, node: DictConfig) -> str | None:
    if isinstance(given, dict):
        return None
    fields = [str(k) for k in node]
    if not fields:
        head = f"{key}={given_text}: {key} takes a mapping, not {shape_of(given)}"
        return f"{head}; write {key}={{name: value}}"
    line = (
        f"{key}={given_text}: {key} takes a mapping of {', '.join(fields)}, not {shape_of(given)}"
    )
    lists = [f for f in fields if isinstance(node.get(f), ListConfig)]
    if isinstance(given, (list, tuple)) and len(lists) == 1:
        return f"{line}; for its list, write {key}.{lists[0]}={given_text}"
    first = fields[0]
    example = f"{key}={{{first}: ...}}" if "." in first else f"{key}.{first}=..."
    return f"{line}; set one of them, e.g. {example}"
