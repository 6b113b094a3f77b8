"""Writes ``data/config_schemas.json``: every registered algorithm's config schema.

The file is the reference :mod:`tests.algorithms.test_config_schemas` holds the configs
to: field names, their order (the order of ``fedrec simulate --help`` and of a stored
job's config), types, defaults, descriptions and bounds. It was written by this script
from the configs as they stood before their shared fields moved to
:mod:`algorithms.config_fields`; regenerate it only on purpose, when a config's schema is
meant to change (``python -m tests.algorithms.config_schemas``), and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path

from algorithms import registry
from algorithms._user_grad import UserGradConfig

PATH = Path(__file__).parent / "data" / "config_schemas.json"


def schemas() -> dict[str, dict]:
    """``model_json_schema()`` of each registered config (and of the shared
    :class:`UserGradConfig`), by algorithm name."""
    out = {name: registry.get(name).config.model_json_schema() for name in registry.names()}
    out["_user_grad"] = UserGradConfig.model_json_schema()
    return out


if __name__ == "__main__":
    PATH.write_text(json.dumps(schemas(), indent=1) + "\n")
    print(f"wrote {PATH}")
