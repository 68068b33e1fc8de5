"""Config from files: Istio/Kubernetes YAML -> the typed model (MeshConfig), hot-reloaded.

    mesh = load_paths(["conf/"])                      # one shot; ConfigError on a bad file
    async with ConfigWatcher(["conf/"], on_change) as watcher:
        ...                                           # watcher.current, watcher.errors

Modules: errors (ConfigError), yamlsource (YAML with line numbers), manifest (object envelope),
fields (typed field access), formats (name/host/IP syntax), protocols (port protocol detection),
kinds/ (one converter per kind), objects (FileConfig), discovery, merge, loader, watcher.
"""

from control.config.discovery import discover
from control.config.errors import ConfigError, DuplicateObjectError
from control.config.loader import DEFAULT_DOMAIN, load_bytes, load_file, load_paths, load_text
from control.config.merge import merge
from control.config.objects import ConfigObject, FileConfig
from control.config.watcher import ConfigWatcher

__all__ = [
    "DEFAULT_DOMAIN",
    "ConfigError",
    "ConfigObject",
    "ConfigWatcher",
    "DuplicateObjectError",
    "FileConfig",
    "discover",
    "load_bytes",
    "load_file",
    "load_paths",
    "load_text",
    "merge",
]
