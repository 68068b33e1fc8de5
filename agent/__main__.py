"""pilotfish-agent: the node agent."""

from __future__ import annotations

from agent.startup import StartupTimeline

# First: the clock of the start timeline (logged when the agent is first ready).
TIMELINE = StartupTimeline()

import gc  # noqa: E402

# The start makes ~57k objects the collector tracks, nearly all for the agent's life
# (modules, classes, functions), and little garbage: the collector's ~70 passes over them
# were 5-7% of the start's CPU. Off until the agent is up (`_collect_from_now_on`). Only
# when run as the agent (`python -m agent`; the console script calls main()), not when
# imported.
if __name__ == "__main__":
    gc.disable()

import sys  # noqa: E402

from agent.sds.workerproc import fork_key_worker  # noqa: E402

# Next: the key worker (agent/sds/keyworker.py), forked before anything more is imported
# (agent/sds/workerproc.py); not for the subcommands, which sign nothing.
FORKED = (
    fork_key_worker()
    if __name__ == "__main__" and sys.argv[1:2] not in (["iptables"], ["wait"])
    else None
)

import asyncio  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

# gRPC's fork handlers are for children that go on using gRPC; ours only exec Envoy. With them
# on, forking Envoy while the TLS channel to the control plane is busy corrupted the channel
# now and then (the control plane logged BAD_DECRYPT, the first CreateCertificate failed with
# "Stream removed" and readiness waited a second for the retry): 2 of 8 starts in
# tests/benchmarks/ca.py, none with them off. Set before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
# gRPC core's EventEngine I/O hands every message from its own threads to the completion-queue
# poller thread and then to the event loop; with the older I/O path the poller thread does the
# I/O itself. One hop less per message in each direction: the relay's push->ACK overhead fell
# from ~0.85 ms to ~0.55 ms (tests/benchmarks/relay.py). An operator's own setting wins.
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_client,-event_engine_listener")

from agent.config import AgentConfig, AgentConfigError, build_parser, config_from_args  # noqa: E402
from agent.sds.keyspec import KeyType, spiffe_id  # noqa: E402
from agent.sds.keyworker import KeyWorker, ProcessKeyWork  # noqa: E402
from pilotfish_common import logsetup, signals  # noqa: E402

if TYPE_CHECKING:
    from agent.envoy.process import EnvoySupervisor

logger = logging.getLogger("agent")

_IMPORT_SWITCH_INTERVAL = 0.0005  # seconds


async def _run(
    cfg: AgentConfig, args: object, keys: ProcessKeyWork, envoy: EnvoySupervisor | None
) -> int:
    # Light imports only until Envoy is started (agent/launch.py); agent.app, with the heavy
    # ones, is imported while Envoy starts on the other core.
    if cfg.redirect and not cfg.proxy_only and os.geteuid() == 0:
        # Before any socket exists: the capture rules exclude the proxy GID, so the agent's
        # own connections (control plane, DNS forwarding) are not sent back into Envoy or to
        # its own DNS server. It stays root (it may still bind and chown what it needs).
        os.setgroups([])
        os.setgid(cfg.proxy_gid)
        logger.info("interception mode REDIRECT: agent joined GID %d", cfg.proxy_gid)
    log_level = getattr(args, "log_level", "info")
    if envoy is not None:
        # Envoy started already (`main`), watched from here on; or, where it could not be,
        # its launcher spawned before gRPC is imported (agent/envoystart.py): its interpreter
        # starts on the other core meanwhile, and it execs Envoy when the launch says so.
        from agent.envoy.process import EnvoyError

        try:
            await envoy.spawn()
        except EnvoyError as e:
            print(f"pilotfish-agent: {e}", file=sys.stderr)
            return 1
        if not envoy.adopted:
            TIMELINE.mark("envoy launcher")
    from agent.launch import Launch

    launch = Launch(cfg, log_level=log_level, timeline=TIMELINE, envoy=envoy, keys=keys)
    # Envoy runs from the launch on: a stop asked for before the agent exists is kept, and the
    # agent drains and stops Envoy once it is up (rather than dying and leaving Envoy to the
    # parent-death signal).
    stop_early = asyncio.Event()
    signals.on_stop(stop_early.set)
    try:
        await launch.start()
    except (OSError, RuntimeError) as e:  # EnvoyError is a RuntimeError
        print(f"pilotfish-agent: {e}", file=sys.stderr)
        await launch.close()
        return 1

    # Then, while Envoy starts, the parts Envoy asks for first, in the order it asks: xDS
    # (its first request goes upstream at once), then the workload certificate (key, CSR and
    # signing round trip in the background, as soon as cryptography is in) and SDS. The rest
    # of the agent is imported in a thread, so that the event loop relays and takes the
    # certificate meanwhile.
    try:
        await launch.start_relay()
        await launch.start_signing()
        await launch.start_certs()
    except (OSError, RuntimeError, ValueError) as e:  # a broken plug-in, say
        print(f"pilotfish-agent: {e}", file=sys.stderr)
        await launch.close()
        return 1
    # A thread that wants the GIL gets it after the holder's switch interval (5 ms by
    # default): each step of the relay and of the signing call would wait that long for the
    # importing thread. Shorter while the imports run.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(_IMPORT_SWITCH_INTERVAL)
    try:
        await asyncio.to_thread(_import_agent, cfg)
    finally:
        sys.setswitchinterval(switch)
    from agent.app import Agent

    TIMELINE.mark("imports")
    agent = Agent(cfg, log_level=log_level, timeline=TIMELINE, launch=launch)
    signals.on_stop(agent.request_stop)
    if stop_early.is_set():
        agent.request_stop()
    try:
        await agent.start()
    except (OSError, RuntimeError) as e:
        print(f"pilotfish-agent: {e}", file=sys.stderr)
        await agent.close()
        return 1
    _collect_from_now_on()
    code = await agent.run()
    logger.info("shutting down (draining for up to %.1fs)", cfg.drain_duration)
    await agent.close()
    return code


def _import_agent(cfg: AgentConfig) -> None:
    """agent.app and the modules only this agent's mode needs (blocking: run in a thread)."""
    from agent import app

    for name in app.mode_modules(cfg):
        importlib.import_module(name)


def _collect_from_now_on() -> None:
    """The collector back on once the agent is up. What the start made is moved out of its
    reach first (gc.freeze): it stays for the agent's life, and every full collection would
    otherwise walk it again."""
    gc.freeze()
    gc.enable()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["iptables"]:
        # A subcommand of its own (an init step, run once as root): the default run mode keeps
        # its flags unchanged, so existing command lines need no "run" word.
        from agent.capture import cli

        sys.exit(cli.main(argv[1:]))
    if argv[:1] == ["wait"]:
        # A postStart hook, started once per pod start: only light imports (agent/wait.py).
        from agent import wait

        sys.exit(wait.main(argv[1:]))
    gc.disable()  # as above, for the console script
    # The console script imported this module without forking the worker: now, then.
    forked = FORKED if __name__ == "__main__" else fork_key_worker()
    first = KeyWorker(*forked) if forked is not None else None
    args = build_parser().parse_args(argv)
    logsetup.setup(args.log_level, args.log_format)
    try:
        cfg = config_from_args(args)
    except AgentConfigError as e:
        print(f"pilotfish-agent: {e}", file=sys.stderr)
        sys.exit(2)
    if first is not None:
        try:
            first.ask_first(
                spiffe_id(cfg.trust_domain, cfg.namespace, cfg.service_account),
                KeyType(cfg.key_type),
            )
        except ValueError:  # no SPIFFE ID: the secret manager says why
            first.abandon()
            first = None
    # Keys and the checks of the CA's answers in worker processes (agent/sds/keyworker.py):
    # cryptography is never loaded in this one for the workload certificate.
    keys = ProcessKeyWork(first)
    envoy = None
    if not cfg.proxy_only:
        # Envoy first, from a fork of this process while it has no thread or event loop yet
        # (agent/envoy/earlystart.py): its own start runs on the other core while this one
        # imports gRPC and binds the sockets Envoy dials.
        from agent.envoystart import envoy_supervisor, start_envoy_now

        envoy = envoy_supervisor(cfg, args.log_level)
        if start_envoy_now(cfg, envoy):
            TIMELINE.mark("envoy started")
    import uvloop

    sys.exit(uvloop.run(_run(cfg, args, keys, envoy)))


if __name__ == "__main__":
    main()
