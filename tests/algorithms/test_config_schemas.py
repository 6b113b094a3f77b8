"""Every algorithm config keeps its schema: the shared fields are declared once
(:mod:`algorithms.config_fields`), yet each config's names, order, types, defaults,
descriptions and bounds are those of the reference file (``data/config_schemas.json``,
written by :mod:`tests.algorithms.config_schemas` from the configs before the move)."""

from __future__ import annotations

import json

import pytest

from tests.algorithms.config_schemas import PATH, schemas

REFERENCE = json.loads(PATH.read_text())
CURRENT = schemas()


def test_every_config_is_in_the_reference():
    assert sorted(CURRENT) == sorted(REFERENCE)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_schema_is_unchanged(name):
    """Equal schemas (a default, description, bound or type that moved fails here) with the
    fields in the same order (``fedrec simulate --help`` and stored configs follow it)."""
    now, then = CURRENT[name], REFERENCE[name]
    assert list(now["properties"]) == list(then["properties"])
    for field, spec in then["properties"].items():
        assert now["properties"][field] == spec, field
    assert now == then

