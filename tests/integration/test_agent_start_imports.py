"""What a real agent has imported once it is up and answering on its status port, Envoy's
mode and proxy-only: none of the modules its start used to pull in for a line or two of
work (issue 23, agent start and idle RSS). Each cost ~0.5-2 ms of the start, on the way to
ready, and their memory for the agent's life; a regression shows here as a module name, not
as milliseconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.envoy import envoy_binary
from tests.support.fresh import ROOT
from tests.support.net import free_port

# shutil (with bz2, lzma): tempfile, shutil.which, argparse's help formatter; encodings.idna
# (with stringprep, unicodedata): the event loop's and the socket module's IDNA encoding of
# listening hosts; http: HTTPStatus for a reason phrase.
FORBIDDEN = (
    "shutil",
    "tempfile",
    "bz2",
    "lzma",
    "encodings.idna",
    "stringprep",
    "unicodedata",
    "http",
)

# The agent's own modules for what this agent does not have: the app's probes' (parser,
# prober, checks) without ISTIO_KUBE_APP_PROBERS, ECDS's Wasm rewriter until an ECDS response
# comes, a gateway certificate's stream rules and the file-mounted secrets' reader until one
# such secret is asked for, the DNS responder's dnslib part until the first query comes, and
# in proxy-only mode the standard metrics' FIFO and wire contract. Each is its code objects
# and dataclass methods for the agent's life (tracemalloc: 15-70 KB apiece) and ~0.5-2.5 ms
# of the start. And cryptography: the first key and its check are the key worker's
# (agent/sds/keyworker.py), ~40 ms of CPU and ~4 MB off this process.
UNUSED = (
    "cryptography",
    "agent.sds.keys",
    "agent.sds.certcheck",
    "agent.health.appprobers",
    "agent.health.appprobe",
    "agent.health.checks",
    "agent.xdsproxy.ecds",
    "agent.sds.fetch",
    "agent.sds.files",
    "agent.dns.answers",
    "dnslib",
)
UNUSED_PROXY_ONLY = ("agent.telemetry.fifo", "protos.telemetry")

# Dataclasses a started agent made with an __eq__ (and, frozen, a __hash__): each generated
# method is one exec of its source at import (~0.05 ms apiece on Python 3.11), and a docstring
# missing costs an inspect.signature. The agent compares none of its start path's by value;
# these two are compared (tests/unit/test_agent_drain.py; a reporter's overrides by their
# compared fields, tests/unit/test_telemetry_records.py).
COMPARED = ("agent.envoy.drain.DrainStep", "agent.telemetry.overrides.SideOverrides")

# The agent as `python -m agent` runs it; a thread waits until its status server answers
# (Agent.start has run: relay, certificate, DNS, status server), then lists what it imported
# and the dataclasses it made at full cost.
# Only modules the agent imports anyway here (the socket module's connect takes an ASCII
# host without the IDNA codec).
_LISTED = """
import os, runpy, socket, sys, threading, time
forbidden, port = sys.argv.pop(1).split(","), int(sys.argv.pop(1))
compared = sys.argv.pop(1).split(",")

def listed():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.socket() as s:
                s.connect(("127.0.0.1", port))
                s.sendall(b"GET /healthz/ready HTTP/1.1\\r\\nHost: agent\\r\\n\\r\\n")
                if s.recv(64).startswith(b"HTTP/1.1 "):
                    break
        except OSError:
            pass
        time.sleep(0.05)
    else:
        print("status server never answered", flush=True)
        os._exit(1)
    print(",".join(m for m in forbidden if m in sys.modules), flush=True)
    costly = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in ("agent", "pilotfish_common", "protos"):
            continue
        for cls in list(vars(module).values()):
            if not isinstance(cls, type) or cls.__module__ != name:
                continue
            params = getattr(cls, "__dataclass_params__", None)
            if params is None:
                continue
            if params.eq and f"{name}.{cls.__qualname__}" not in compared:
                costly.append(f"{name}.{cls.__qualname__} (__eq__)")
            if (cls.__doc__ or "").startswith(cls.__name__ + "("):
                costly.append(f"{name}.{cls.__qualname__} (no docstring)")
    print(",".join(sorted(costly)), flush=True)
    os._exit(0)

# The thread only once the agent has forked its key worker (it forks none beside a thread).
from agent.sds import workerproc
fork = workerproc.fork_key_worker

def fork_then_list():
    forked = fork()
    print("worker" if forked is not None else "no worker", flush=True)
    threading.Thread(target=listed, daemon=True).start()
    return forked

workerproc.fork_key_worker = fork_then_list
sys.argv[0] = "agent"
runpy.run_module("agent", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("proxy_only", [False, True], ids=["envoy", "proxy-only"])
def test_started_agent_imported_none_of_the_start_path_leftovers(
    tmp_path: Path, proxy_only: bool
) -> None:
    status = free_port()
    args = [
        "--control-plane",
        f"127.0.0.1:{free_port()}",  # nothing listens: the start does not wait for it
        "--workdir",
        str(tmp_path / "work"),
        "--ip",
        "127.0.0.1",
        "--status-port",
        str(status),
        "--dns-port",
        str(free_port()),
        "--envoy-admin-port",
        str(free_port()),
        "--log-level",
        "warning",
    ]
    args += ["--proxy-only"] if proxy_only else ["--envoy-binary", envoy_binary()]
    unwanted = FORBIDDEN + UNUSED + (UNUSED_PROXY_ONLY if proxy_only else ())
    env = {k: v for k, v in os.environ.items() if k != "ISTIO_KUBE_APP_PROBERS"}
    out = subprocess.run(
        [sys.executable, "-c", _LISTED, ",".join(unwanted), str(status), ",".join(COMPARED), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "worker", "the agent forked no key worker"
    assert lines[1] == "", f"the started agent imported {lines[1]}"
    assert lines[2] == "", f"dataclasses made on the way to ready at full cost: {lines[2]}"
