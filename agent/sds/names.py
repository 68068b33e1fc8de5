"""Which secret names the agent serves besides its own certificate, told from the name
alone: `kubernetes://…` ones the control plane holds (fetched by remote.py with the rules of
fetch.py) and file-mounted ones (`file-cert:<cert>~<key>`, `file-root:<ca>`, read by
files.py). The secret manager asks this of every name an SDS stream opens; the modules that
fetch or read such secrets (their protos, certificate checks and dataclasses) are loaded only
once one is asked for, so an agent that serves none loads none of them (issue 23)."""

from __future__ import annotations

# Istio's names for Secrets the control plane holds (credentialName / certificateRefs).
REMOTE_PREFIX = "kubernetes://"
FILE_CERT_PREFIX = "file-cert:"
FILE_ROOT_PREFIX = "file-root:"


class FileSecretError(ValueError):
    """A file-mounted secret is malformed: a bad resource name, a missing or invalid file."""


def is_remote_name(name: str) -> bool:
    return name.startswith(REMOTE_PREFIX) and len(name) > len(REMOTE_PREFIX)


def is_file_resource(name: str) -> bool:
    return name.startswith((FILE_CERT_PREFIX, FILE_ROOT_PREFIX))


def file_resource_paths(name: str) -> tuple[str, ...]:
    """The paths a `file-cert:`/`file-root:` name gives ((cert, key) or (ca,));
    FileSecretError if malformed."""
    if name.startswith(FILE_CERT_PREFIX):
        cert, sep, key = name.removeprefix(FILE_CERT_PREFIX).partition("~")
        if not sep or not cert or not key:
            raise FileSecretError(f"{name!r}: expected file-cert:<cert path>~<key path>")
        return (cert, key)
    if name.startswith(FILE_ROOT_PREFIX):
        ca = name.removeprefix(FILE_ROOT_PREFIX)
        if not ca:
            raise FileSecretError(f"{name!r}: expected file-root:<ca path>")
        return (ca,)
    raise FileSecretError(f"{name!r} is not a file-mounted secret")
