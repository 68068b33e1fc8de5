"""The mesh config in effect, and the file it comes from.

- `MeshConfigFile` polls `--mesh-config FILE` (the stdlib has no inotify), as ConfigWatcher
  polls config files: a changed file is re-read once it has been quiet for `debounce`; a bad
  version is logged once as `file:line: reason` and the last good one stays in use.
- `EffectiveMeshConfig` is what the push pipeline subscribes to (a MeshConfigSource): the
  first input that holds a config (the ConfigMap `istio` in Kubernetes mode, then the file;
  none: Istio's defaults) with the flags' overrides on top. It hands a new version over only
  when the effective settings changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from control.config.delivery import WarningLog
from control.config.errors import ConfigError
from control.config.loader import decode, read_file
from control.config.meshconfig import parse_mesh_config
from control.config.source import MeshChangeHandler
from control.config.watcher import Stamp, file_stamp
from control.model.meshconfig import MeshOverrides, MeshSettings
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

logger = logging.getLogger(__name__)


class MeshInput(Protocol):
    """One place a mesh config may come from. `current` is its last good version (None: it
    has none, e.g. the ConfigMap does not exist); `on_change` (set by the owner before
    start()) is called on the event loop whenever `current` or `error` changed."""

    name: str
    on_change: Callable[[], None]

    @property
    def current(self) -> MeshSettings | None: ...

    @property
    def error(self) -> ConfigError | None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def load_mesh_file(path: str) -> MeshSettings:
    """Read and parse one mesh config file (blocking: call it in a thread)."""
    data = read_file(path)
    return parse_mesh_config(decode(data, path), path)


class MeshInputBase(Lifecycle):
    """What every MeshInput keeps: its last good version, its current error, and the task
    that keeps them current (cancelled by close())."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.on_change: Callable[[], None] = lambda: None
        self._current: MeshSettings | None = None
        self._error: ConfigError | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def current(self) -> MeshSettings | None:
        return self._current

    @property
    def error(self) -> ConfigError | None:
        return self._error

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel(task)


class MeshConfigFile(MeshInputBase):
    """`--mesh-config FILE`, watched. start() raises ConfigError for a missing or bad file."""

    def __init__(self, path: str, *, poll_interval: float = 0.25, debounce: float = 0.05) -> None:
        super().__init__(path)
        self.path = path
        self.poll_interval = poll_interval
        self.debounce = debounce
        self._stamp: Stamp | None = None

    async def start(self) -> None:
        self._stamp = await asyncio.to_thread(file_stamp, self.path, time.time())
        self._current = await asyncio.to_thread(load_mesh_file, self.path)
        self._task = asyncio.create_task(self._run(), name="mesh-config-watcher")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                stamp = await asyncio.to_thread(file_stamp, self.path, time.time())
                if stamp == self._stamp:
                    continue
                # An editor writes in steps: wait until the file has been quiet a while.
                while True:
                    await asyncio.sleep(self.debounce)
                    again = await asyncio.to_thread(file_stamp, self.path, time.time())
                    if again == stamp:
                        break
                    stamp = again
                self._stamp = stamp
                await self._reload(stamp is None)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug, not a user error: keep watching
                logger.exception("mesh config reload failed unexpectedly")

    async def _reload(self, missing: bool) -> None:
        if missing:
            error: ConfigError | None = ConfigError(self.path, 1, "mesh config file is missing")
            settings = None
        else:
            try:
                settings = await asyncio.to_thread(load_mesh_file, self.path)
                error = None
            except ConfigError as e:
                settings, error = None, e
        if error is not None:
            if error != self._error:
                logger.error("%s (keeping the last good mesh config)", error)
            self._error = error
            self.on_change()
            return
        if self._error is not None:
            logger.info("mesh config %s is valid again", self.path)
        self._error = None
        if settings != self._current:
            self._current = settings
            logger.info("mesh config reloaded from %s", self.path)
        self.on_change()


class EffectiveMeshConfig(Lifecycle):
    """The MeshConfigSource the control plane is wired with (see the module doc).

    `inputs` in priority order (the first that holds a config wins); `overrides` are the
    flags that were given."""

    def __init__(
        self, inputs: Sequence[MeshInput] = (), overrides: MeshOverrides = MeshOverrides()
    ) -> None:
        self._inputs = tuple(inputs)
        self._overrides = overrides
        self._handlers: list[MeshChangeHandler] = []
        self._warnings = WarningLog(logger)
        self._current = overrides.apply(MeshSettings())
        self.reloads = 0
        for i in self._inputs:
            i.on_change = self._input_changed

    @property
    def current(self) -> MeshSettings:
        return self._current

    @property
    def errors(self) -> Mapping[str, ConfigError]:
        return {i.name: i.error for i in self._inputs if i.error is not None}

    def subscribe(self, handler: MeshChangeHandler) -> None:
        self._handlers.append(handler)

    def status(self) -> Mapping[str, object]:
        return {
            "inputs": [i.name for i in self._inputs],
            "in_use": self._current.source or "defaults",
            "errors": {k: str(e) for k, e in sorted(self.errors.items())},
            "warnings": [str(w) for w in self._current.warnings],
            "reloads": self.reloads,
            "in_effect": self._current.as_json(),
        }

    async def start(self) -> None:
        started: list[MeshInput] = []
        try:
            for i in self._inputs:
                await i.start()
                started.append(i)
        except BaseException:
            for i in reversed(started):
                await i.close()
            raise
        self._current = self._effective()
        self._warnings.update(self._current.warnings)

    async def close(self) -> None:
        for i in reversed(self._inputs):
            await i.close()

    def _effective(self) -> MeshSettings:
        chosen = next((i.current for i in self._inputs if i.current is not None), None)
        return self._overrides.apply(chosen if chosen is not None else MeshSettings())

    def _input_changed(self) -> None:
        settings = self._effective()
        self._warnings.update(settings.warnings)
        if settings == self._current:
            return
        self._current = settings
        self.reloads += 1
        for handler in self._handlers:
            try:
                handler(settings)
            except Exception:
                logger.exception("mesh config change handler failed")
