"""Which engine serves which model: the catalog of ``STREAMING["ENGINES"]``.

Each engine serves the model it is configured with (``MODEL``; the simulated engine's is
``simulated``) or, configured without one, whatever its server lists at ``/v1/models``
(asked when the catalog is, and remembered). A request names a model; the engine that
serves it answers, and a request that names none goes to the ``default`` engine. Several
OpenAI-compatible servers (one model each, or a router serving several) thus sit behind
one chat backend, each conversation or message choosing among them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from streaming.engines.base import Engine, EngineError, ModelInfo


@dataclass(frozen=True, slots=True)
class Served:
    """A model as ``/v1/models`` describes it, and the engine that serves it."""

    info: ModelInfo
    engine: Engine


class Catalog:
    def __init__(self, engines: Mapping[str, Engine]) -> None:
        if "default" not in engines:
            raise ValueError('STREAMING["ENGINES"] needs a "default" engine')
        self.engines = dict(engines)
        self.default = engines["default"]
        # Models learned from the servers of engines configured without one.
        self._listed: dict[str, Engine] = {}

    def engine_for(self, model: str) -> Engine:
        """The engine serving ``model`` (the default one for "" and for names it does not
        know: that engine then answers for them, as its server sees fit)."""
        for engine in self.engines.values():
            if engine.model and engine.model == model:
                return engine
        return self._listed.get(model, self.default)

    def known(self, model: str) -> bool | None:
        """Whether ``model`` is served, without asking any server: None when only a
        server's list could tell."""
        if any(engine.model == model for engine in self.engines.values() if engine.model):
            return True
        if model in self._listed:
            return True
        return None if any(not engine.model for engine in self.engines.values()) else False

    async def served(self) -> list[Served]:
        """Every model of every engine, the default engine's first. A server that cannot
        be asked contributes none of its listed models (its configured one still counts)."""
        engines = [self.default, *(e for e in self.engines.values() if e is not self.default)]
        lists = await asyncio.gather(*(self._models_of(engine) for engine in engines))
        seen: dict[str, Served] = {}
        for engine, models in zip(engines, lists, strict=True):
            for info in models:
                seen.setdefault(info.id, Served(info, engine))
                if not engine.model:
                    self._listed.setdefault(info.id, engine)
        return list(seen.values())

    @staticmethod
    async def _models_of(engine: Engine) -> list[ModelInfo]:
        try:
            models = await engine.models()
        except EngineError:
            models = []
        if engine.model:
            # Configured with a model, an engine serves that one name, listed or not.
            known = next((m for m in models if m.id == engine.model), None)
            return [known or ModelInfo(engine.model, engine.name)]
        return models
