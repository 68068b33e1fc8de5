"""Watching config files and hot-reloading them, keeping the last good version of each file.

The watcher polls (the stdlib has no inotify): every `poll_interval` it lists the watched paths
and stats the files, in a worker thread. When something changed it waits until nothing has
changed for `debounce` seconds (an editor or `kubectl cp` writes in several steps), reparses
only the files that changed, and merges. A file that fails to load is logged once as
`file:line: reason` and its previous good objects stay in use; the other files still update.
`on_change` (and every handler given to `subscribe`) is called only when the merged MeshConfig
is different from the current one. It implements `control.config.source.ConfigSource`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from control.config.delivery import WarningLog, deliver
from control.config.discovery import discover
from control.config.documents import DocumentCache
from control.config.errors import ConfigError, DuplicateObjectError
from control.config.loader import DEFAULT_DOMAIN, load_bytes, read_file
from control.config.merge import merge
from control.config.objects import FileConfig
from control.gatewayapi.translate import Translator
from control.model.types import MeshConfig
from pilotfish_common.lifecycle import Lifecycle
from pilotfish_common.tasks import cancel

if TYPE_CHECKING:
    from control.kube.client import KubeClient

logger = logging.getLogger(__name__)

OnChange = Callable[[MeshConfig], Awaitable[None] | None]

# What identifies a version of a file: (mtime_ns, ctime_ns, size, inode, content digest or "").
Stamp = tuple[int, int, int, int, str]

# A file modified this recently may be modified again within the same timestamp tick, which
# would leave its stat unchanged; for such files the content digest is part of the stamp
# (git's "racily clean" rule).
_RACY_SECONDS = 2.0


def file_stamp(path: str, now: float) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    digest = ""
    if now - st.st_mtime < _RACY_SECONDS:
        try:
            with open(path, "rb") as fh:
                digest = content_digest(fh.read())
        except OSError as exc:  # unreadable: loading it will report the error
            digest = f"error: {exc.strerror}"
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, digest)


def _scan(paths: tuple[str, ...]) -> dict[str, Stamp]:
    """The current files under `paths` and their stamps (runs in a worker thread)."""
    now = time.time()
    out: dict[str, Stamp] = {}
    for file in discover(paths, missing_ok=True):
        stamp = file_stamp(file, now)
        if stamp is not None:
            out[file] = stamp
    return out


def content_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class _Unchanged:
    """The file's bytes are the ones its current version was loaded from."""


UNCHANGED = _Unchanged()

# Result of loading one file in the worker thread: a FileConfig, a ConfigError, UNCHANGED, or
# None when the file disappeared between the scan and the read.
_Loaded = FileConfig | ConfigError | _Unchanged | None


def _load_files(
    files: Iterable[str],
    domain: str,
    revision: str = "",
    known: Mapping[str, str] | None = None,
    digests: dict[str, str] | None = None,
    documents: DocumentCache | None = None,
) -> dict[str, _Loaded]:
    """Load `files`. `known`: the content digest each file's current version was loaded
    from; a file whose bytes still have it is UNCHANGED and not parsed again. A stat change
    alone does not mean new bytes: every written file leaves the racy window (its stamp
    drops the digest) two seconds later, and `touch` or a rewrite of the same text changes
    the times. `digests` receives the digest of every file read."""
    out: dict[str, _Loaded] = {}
    for file in files:
        try:
            data = read_file(file)
        except ConfigError as exc:
            out[file] = None if not os.path.exists(file) else exc
            continue
        digest = content_digest(data)
        if digests is not None:
            digests[file] = digest
        if known is not None and known.get(file) == digest:
            out[file] = UNCHANGED
            continue
        try:
            out[file] = load_bytes(data, file, domain, revision, documents)
        except ConfigError as exc:
            out[file] = exc
        except Exception as exc:  # a bug in a validator; reject the file, don't retry forever
            logger.exception("unexpected error while loading %s", file)
            out[file] = ConfigError(file, 1, f"internal error while loading the file: {exc!r}")
    return out


class ConfigWatcher(Lifecycle):
    """Keeps `current` in sync with the config files under `paths`.

    `start()` loads everything once and raises ConfigError if any file is bad (the control
    plane should not start on broken config); `on_change` is not called for that first load.
    Afterwards, changes are applied in the background; `errors` holds the current error of
    each file that is failing (its last good version is still in use).
    """

    def __init__(
        self,
        paths: Iterable[str],
        on_change: OnChange | None = None,
        *,
        debounce: float = 0.1,
        poll_interval: float = 0.25,
        domain: str = DEFAULT_DOMAIN,
        revision: str = "",
    ) -> None:
        self.paths = tuple(paths)
        self.revision = revision  # config labelled for another istio.io/rev is left out
        self._handlers: list[OnChange] = [] if on_change is None else [on_change]
        self.debounce = debounce
        self.poll_interval = poll_interval
        self.domain = domain
        self.current = MeshConfig()
        self.errors: dict[str, ConfigError] = {}
        self.reloads = 0  # times `current` changed after start() (= on_change calls)
        # time.monotonic() when the scan that `current` reflects began: every write finished
        # before it is in `current` (a push's record says which changes it can carry).
        self.snapshot_at = 0.0
        self.failed_loads = 0  # file versions rejected after start()
        self._good: dict[str, FileConfig] = {}  # the version of each file in use
        # Keeps the last Gateway API translation: a reload translates the routes it changed.
        self._translator = Translator()
        self._latest: dict[str, FileConfig] = {}  # newest valid version (may be a duplicate)
        self._parse_errors: dict[str, ConfigError] = {}
        self._stamps: dict[str, Stamp] = {}  # the stamps the state above reflects
        # The content digest of the bytes each file's newest load (valid or not) came from.
        self._digests: dict[str, str] = {}
        self._warnings = WarningLog(logger)
        # What each file's documents loaded to: a reload composes only those that changed.
        self._documents = DocumentCache()
        self._task: asyncio.Task[None] | None = None
        self._started = False

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load all files; raises ConfigError for a missing path or any bad file."""
        if self._started:
            raise RuntimeError("ConfigWatcher already started")
        scanned_at = time.monotonic()
        files = await asyncio.to_thread(discover, self.paths)
        stamps = await asyncio.to_thread(_scan, self.paths)
        digests: dict[str, str] = {}
        loaded = await asyncio.to_thread(
            _load_files, files, self.domain, self.revision, None, digests, self._documents
        )
        self._digests = digests
        for file in files:
            result = loaded[file]
            if isinstance(result, ConfigError):
                raise result
            if isinstance(result, FileConfig):  # not None (gone since the listing)
                self._good[file] = self._latest[file] = result
        self.current = merge(list(self._good.values()), translator=self._translator)
        self._stamps = {f: s for f, s in stamps.items() if f in self._good}
        self.snapshot_at = scanned_at
        self._warnings.update(self.current.warnings)
        self._started = True
        self._task = asyncio.create_task(self._run(), name="config-watcher")
        logger.info(
            "config loaded from %d file(s): %d services, %d workload entries, %d sidecars",
            len(self._good),
            len(self.current.services),
            len(self.current.workload_entries),
            len(self.current.sidecars),
        )

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    @property
    def files(self) -> list[str]:
        """The files whose objects are in `current` (last good versions)."""
        return sorted(self._good)

    def subscribe(self, handler: OnChange) -> None:
        """Hand every later config to `handler` too (after the ones already subscribed)."""
        self._handlers.append(handler)

    @property
    def kube_client(self) -> KubeClient | None:
        return None  # files: no API server

    def namespace_labels(self, namespace: str) -> None:
        """Files have no namespaces: only a pod's own label or annotation asks for a
        sidecar."""
        del namespace

    # --- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                stamps = await asyncio.to_thread(_scan, self.paths)
                if stamps == self._stamps:
                    continue
                stamps, scanned_at = await self._settle(stamps)
                await self._apply(stamps, scanned_at)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug, not a user error: keep watching
                logger.exception("config reload failed unexpectedly")

    async def _settle(self, stamps: dict[str, Stamp]) -> tuple[dict[str, Stamp], float]:
        """Wait until the files have not changed for `debounce` seconds. Returns their stamps
        and when the last scan (which found them unchanged) began."""
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        step = max(0.005, min(self.debounce, self.poll_interval))
        scanned_at = time.monotonic()
        while loop.time() - quiet_since < self.debounce:
            await asyncio.sleep(step)
            scanned_at = time.monotonic()
            latest = await asyncio.to_thread(_scan, self.paths)
            if latest != stamps:
                stamps, quiet_since = latest, loop.time()
        return stamps, scanned_at

    async def _apply(self, stamps: dict[str, Stamp], scanned_at: float = 0.0) -> None:
        changed = sorted(f for f, s in stamps.items() if self._stamps.get(f) != s)
        removed = sorted(set(self._stamps) - set(stamps))
        digests: dict[str, str] = {}
        loaded = await asyncio.to_thread(
            _load_files,
            changed,
            self.domain,
            self.revision,
            dict(self._digests),
            digests,
            self._documents,
        )
        self._digests.update(digests)
        fresh = False  # whether any file has a new version (valid or not) or went away
        for file, result in loaded.items():
            if result is UNCHANGED:
                continue
            fresh = True
            if result is None:  # deleted between the scan and the read
                stamps.pop(file, None)
                removed.append(file)
            elif isinstance(result, ConfigError):
                self._parse_errors[file] = result
                self.failed_loads += 1
                self._latest.pop(file, None)
            elif isinstance(result, FileConfig):
                self._parse_errors.pop(file, None)
                self._latest[file] = result
        for file in removed:
            fresh = True
            if file in self._stamps:
                logger.info("config file removed: %s", file)
            self._latest.pop(file, None)
            self._good.pop(file, None)
            self._parse_errors.pop(file, None)
            self._digests.pop(file, None)
            self._documents.forget(file)
        self._stamps = stamps
        if not fresh:  # only stamps moved: the merge would give the same config again
            self.snapshot_at = max(self.snapshot_at, scanned_at)
            return

        # Each file contributes its newest valid version, or else its last good one.
        candidates: dict[str, FileConfig] = {}
        for file in sorted(stamps):
            version = self._latest.get(file) or self._good.get(file)
            if version is not None:
                candidates[file] = version
        merged, self._good, duplicates = self._merge(candidates)
        self._set_errors(self._parse_errors | duplicates)

        previous, self.current = self.current, merged
        self.snapshot_at = max(self.snapshot_at, scanned_at)
        self._warnings.update(self.current.warnings)
        if merged != previous:
            self.reloads += 1
            logger.info(
                "config reloaded (%d changed, %d removed): %d services, %d workload entries, "
                "%d sidecars",
                len(changed),
                len(removed),
                len(merged.services),
                len(merged.workload_entries),
                len(merged.sidecars),
            )
            for handler in self._handlers:
                await deliver(handler, merged, logger)

    def _merge(
        self, candidates: dict[str, FileConfig]
    ) -> tuple[MeshConfig, dict[str, FileConfig], dict[str, ConfigError]]:
        """Merge the candidates. When a new file version defines an object that another file
        already defines, that version is rejected (the file's last good version is used, or
        none) and the merge is retried; the files in use before never conflict, so this ends.
        Returns (config, the versions used, errors of rejected versions)."""
        files = dict(candidates)
        rejected: dict[str, ConfigError] = {}
        while True:
            try:
                return merge(list(files.values()), translator=self._translator), files, rejected
            except DuplicateObjectError as exc:
                fresh = [
                    f
                    for f in (exc.first_file, exc.file)
                    if f in files and files[f] is not self._good.get(f)
                ]
                culprit = fresh[-1] if fresh else exc.file
                if culprit == exc.file:
                    err: ConfigError = exc
                else:  # point the error at the rejected file, naming the other place
                    err = DuplicateObjectError(
                        exc.first_file,
                        exc.first_line,
                        f"duplicate {exc.what}: already defined at {exc.file}:{exc.line}",
                        first_file=exc.file,
                        first_line=exc.line,
                        what=exc.what,
                    )
                rejected.setdefault(culprit, err)
                fallback = self._good.get(culprit)
                if fallback is not None and files.get(culprit) is not fallback:
                    files[culprit] = fallback
                else:
                    files.pop(culprit, None)

    def _set_errors(self, errors: dict[str, ConfigError]) -> None:
        for file, err in sorted(errors.items()):
            if self.errors.get(file) != err:
                keeping = "keeping its last good version" if file in self._good else "not loaded"
                logger.error("%s (%s)", err, keeping)
        for file in sorted(set(self.errors) - set(errors)):
            if file in self._stamps:
                logger.info("config file %s is valid again", file)
        self.errors = dict(sorted(errors.items()))

    # --- debugging -------------------------------------------------------------------------

    def status(self) -> Mapping[str, object]:
        """A JSON-friendly summary for /debug and /ready."""
        return {
            "files": self.files,
            "errors": {f: str(e) for f, e in sorted(self.errors.items())},
            "reloads": self.reloads,
            "failed_loads": self.failed_loads,
            "warnings": [str(w) for w in self.current.warnings],
        }
