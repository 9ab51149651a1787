"""The schema the models make: every lookup has an index, and no index is paid twice.

Every answer inserts two messages and a segment and rewrites all three rows' statuses as
it ends; a change of status writes an entry into every index of the row. So an index
whose columns begin another index's (which serves every lookup it would) costs each
answer writes and WAL for nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import DO_NOTHING, ForeignKey, Model

from streaming.models import Conversation, Message, Segment

pytestmark = pytest.mark.django_db

MODELS: list[type[Model]] = [Conversation, Message, Segment]
# Columns that queries filter by (besides the foreign keys) whatever their value; a
# segment's status and worker are read only for the segments streaming now (a partial
# index, ``tests/unit/test_reaper.py``).
FILTERED = {Message: ["status"]}


def _partial(model: type[Model]) -> set[str]:
    """Names of the model's indexes and unique constraints that hold only some rows."""
    meta = model._meta
    named = [*meta.indexes, *meta.constraints]
    return {item.name for item in named if getattr(item, "condition", None) is not None}


def _indexes(model: type[Model]) -> dict[str, dict[str, Any]]:
    """The table's indexes, unique constraints and primary key, by name (all rows)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, model._meta.db_table)
    partial = _partial(model)
    return {
        name: info
        for name, info in found.items()
        if (info["index"] or info["unique"] or info["primary_key"]) and name not in partial
    }


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_each_foreign_key_and_filtered_column_begins_an_index(model: type[Model]) -> None:
    # A foreign key that deletes cascade through is looked up by its column; one that
    # only copies a value (``Message.owner``) is read through the index that needs it.
    columns = [
        field.column
        for field in model._meta.concrete_fields
        if isinstance(field, ForeignKey)
        and field.column
        and field.remote_field.on_delete is not DO_NOTHING
    ]
    columns += [model._meta.get_field(name).column for name in FILTERED.get(model, [])]
    leading = {info["columns"][0] for info in _indexes(model).values()}
    assert columns, "the model has lookups to check"
    assert [column for column in columns if column not in leading] == []


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_no_index_is_covered_by_another(model: type[Model]) -> None:
    indexes = _indexes(model)
    covered = [
        (name, other)
        for name, info in indexes.items()
        if not (info["unique"] or info["primary_key"])
        for other, wider in indexes.items()
        if other != name
        and wider["columns"][: len(info["columns"])] == info["columns"]
        and (len(wider["columns"]) > len(info["columns"]) or name > other)
    ]
    assert covered == []
