"""Model instances from the rows of SQL written by hand, as ``raw()`` gives them.

``Model.objects.using(alias).raw(sql, params)`` clones a queryset on every call (a deep
copy of its ``Query``) and works out again which column is which field and which
converters apply; for the reads every answer makes (the locking read, the prompt's
messages, a token's user) that cost more CPU than the statement itself. A ``Reader``
works that out once per set of columns a result has, and then only runs the statement: the
rows go through the fields' converters (the database's and the field's own, as the
ORM applies them) into ``Model.from_db``, so an instance is what ``raw()`` would give,
with the fields not selected deferred. Every column must be a concrete field of the
model (no annotations). Statements name their columns (``columns``), never ``*``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Expression, Model
from django.db.models.sql import Query

M = TypeVar("M", bound=Model)
Converter = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class _Plan:
    columns: list[str]  # the result's columns, as the cursor names them
    names: list[str]  # attnames, in the model's field order (``from_db``'s)
    positions: list[int]  # where each of them is in a row
    converters: list[tuple[int, list[Converter], Any]]  # (position, converters, column)


def columns(connection: BaseDatabaseWrapper, model: type[Model], table: str = "") -> str:
    """Every concrete column of ``model``, named, for a ``SELECT`` (``table.`` before each
    when given).

    Never ``*``: a statement PostgreSQL has prepared fails once its result would change
    shape, as ``*`` does when a migration adds a column under a running process."""
    prefix = f"{table}." if table else ""
    quote = connection.ops.quote_name
    return ", ".join(
        prefix + quote(field.column) for field in model._meta.concrete_fields if field.column
    )


class Reader(Generic[M]):
    """``fetch(params)``: the instances of ``model`` that ``sql`` selects on ``alias``."""

    def __init__(self, model: type[M], alias: str, sql: str) -> None:
        self.model = model
        self.alias = alias
        self.sql = sql
        self._plan: _Plan | None = None
        self._planning = threading.Lock()

    def fetch(self, params: Sequence[Any]) -> list[M]:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(self.sql, params)
            return self.read(cursor)

    def read(self, cursor: Any) -> list[M]:
        """The instances of the result ``cursor`` holds: ``sql`` executed on it (alone, or
        with other statements in one round trip)."""
        connection = connections[self.alias]
        # Rows first: in a pipeline, fetching is what brings the result (and its columns).
        rows = cursor.fetchall()
        columns = [column[0] for column in cursor.description]
        plan = self._plan
        if plan is None or plan.columns != columns:
            plan = self._make_plan(columns)
        instances = []
        for row in rows:
            values = list(row)
            for position, converters, column in plan.converters:
                value = values[position]
                for convert in converters:
                    value = convert(value, column, connection)
                values[position] = value
            ordered = [values[position] for position in plan.positions]
            instances.append(self.model.from_db(self.alias, plan.names, ordered))
        return instances

    def _make_plan(self, columns: list[str]) -> _Plan:
        with self._planning:
            if self._plan is None or self._plan.columns != columns:
                self._plan = self._planned(columns)
            return self._plan

    def _planned(self, columns: list[str]) -> _Plan:
        connection = connections[self.alias]
        normal = connection.introspection.identifier_converter
        meta = self.model._meta
        by_column = {normal(field.column): field for field in meta.concrete_fields}
        unknown = [column for column in columns if normal(column) not in by_column]
        if unknown:
            raise ValueError(f"columns that are not fields of {meta.label}: {unknown}")
        fields = [by_column[normal(column)] for column in columns]
        if not any(field.primary_key for field in fields):
            raise ValueError("the statement must select the primary key")
        order = {field: index for index, field in enumerate(meta.concrete_fields)}
        positions = sorted(range(len(fields)), key=lambda position: order[fields[position]])
        compiler = connection.ops.compiler("SQLCompiler")(Query(self.model), connection, self.alias)
        cols: list[Expression] = [field.get_col(meta.db_table) for field in fields]
        converters = [
            (position, list(found), column)
            for position, (found, column) in compiler.get_converters(cols).items()
        ]
        return _Plan(
            columns=columns,
            names=[fields[position].attname for position in positions],
            positions=positions,
            converters=converters,
        )
