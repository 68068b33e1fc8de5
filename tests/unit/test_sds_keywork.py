"""The key work (agent/sds/keywork.py, agent/sds/keyworker.py): the worker's wire without a
process, with real keys and a real CA; then the forked worker itself, in a fresh interpreter
(this one has gRPC and threads, where the worker refuses to fork), its answers checked
against what the same steps give in-process, and every way it can fail falling back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cryptography import x509

from agent.sds.keys import generate_key_and_csr
from agent.sds.keyspec import KeyType
from agent.sds.keywire import (
    MAX_FRAME,
    FrameError,
    Frames,
    answer,
    cert_from_reply,
    check_request,
    encode,
    key_from_reply,
    key_request,
)
from agent.sds.signer import SigningError
from agent.sds.workerproc import fork_key_worker
from tests.support.fresh import ROOT
from tests.support.testca import TestCA

ID = "spiffe://cluster.local/ns/shop/sa/cart"


def test_frames_come_out_whole_however_the_bytes_are_cut() -> None:
    one, two = {"op": "key", "n": 1}, {"op": "check", "chain": ["x" * 5000]}
    data = encode(one) + encode(two)
    for cut in (1, 3, 4, 5, 17, len(encode(one)), len(data) - 1):
        frames = Frames()
        assert frames.feed(data[:cut]) + frames.feed(data[cut:]) == [one, two]
    frames = Frames()
    assert [m for b in data for m in frames.feed(bytes([b]))] == [one, two]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ((MAX_FRAME + 1).to_bytes(4, "big"), "frame of"),
        (b"\x00\x00\x00\x03{x}", "not valid JSON"),
        (b"\x00\x00\x00\x02[]", "expected a JSON object"),
    ],
)
def test_what_is_no_frame_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        Frames().feed(data)


def test_a_key_answer_is_a_key_and_csr_for_the_identity() -> None:
    reply = json.loads(json.dumps(answer(key_request(ID, KeyType.EC_P256))))
    kc = key_from_reply(reply)
    csr = x509.load_pem_x509_csr(kc.csr_pem)
    assert csr.is_signature_valid
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [ID]
    assert kc.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")


def test_a_key_request_for_no_spiffe_id_is_a_value_error() -> None:
    reply = answer(key_request("cart", KeyType.EC_P256))
    assert reply["kind"] == "value"
    with pytest.raises(ValueError, match="SPIFFE URI"):
        key_from_reply(reply)


def test_a_check_answer_is_the_certificate_as_checked_in_process() -> None:
    ca = TestCA()
    kc = generate_key_and_csr(ID)
    chain = ca.sign_csr(kc.csr_pem, 3600)
    cert = cert_from_reply(json.loads(json.dumps(answer(check_request(chain, kc.key_pem, None)))))
    leaf = x509.load_pem_x509_certificate(chain[0].encode())
    assert cert.serial == leaf.serial_number
    assert cert.not_after == leaf.not_valid_after_utc.timestamp()
    assert cert.identity == ID
    assert cert.key_pem == kc.key_pem
    assert cert.root_pem == chain[-1].encode()
    assert cert.chain_pem == "".join(chain[:-1]).encode()


def test_a_check_that_fails_raises_the_signing_error_it_would_in_process(tmp_path: Path) -> None:
    ca = TestCA()
    chain = ca.sign_csr(generate_key_and_csr(ID).csr_pem, 3600)
    other_key = generate_key_and_csr(ID).key_pem
    reply = answer(check_request(chain, other_key, None))
    with pytest.raises(SigningError, match="not for our key") as e:
        cert_from_reply(reply)
    assert e.value.retryable
    missing = tmp_path / "no-root.pem"
    with pytest.raises(SigningError, match=r"no-root\.pem"):
        cert_from_reply(answer(check_request(chain[:1], other_key, missing)))


@pytest.mark.parametrize(
    "reply",
    [{"key_pem": "k"}, {"chain_pem": "c", "serial": "x"}, {"csr_pem": "é", "key_pem": "é"}],
)
def test_an_answer_of_the_wrong_shape_is_a_frame_error(reply: dict[str, object]) -> None:
    with pytest.raises(FrameError):
        key_from_reply(reply) if "serial" not in reply else cert_from_reply(reply)


def test_an_unknown_request_is_answered_with_an_error() -> None:
    assert answer({"op": "sign"})["kind"] == "value"


def test_no_worker_where_a_thread_or_grpc_would_be_shared() -> None:
    # This interpreter has imported gRPC (the suite's other modules); a fork would copy its
    # state into a child that never uses it.
    import grpc  # noqa: F401

    assert fork_key_worker() is None


# The workers for real: a fresh interpreter that has not imported gRPC forks one and uses it
# as agent/__main__.py does (`ProcessKeyWork`), then makes a second certificate as a rotation
# does (a spawned worker). `case` picks what goes wrong; the script prints one JSON line.
_SCRIPT = """
import asyncio, json, os, signal, sys, time
from agent.sds import keyworker
from agent.sds.keyspec import KeyType
from agent.sds.keyworker import KeyWorker, ProcessKeyWork
from agent.sds.workerproc import fork_key_worker

case, ident = sys.argv[1], sys.argv[2]
keyworker.REPLY_TIMEOUT = 1.0
first = KeyWorker(*fork_key_worker())
pid = first.pid
first.ask_first(ident, KeyType.EC_P256)
if case == "killed":
    os.kill(pid, signal.SIGKILL)
if case == "stopped":
    os.kill(pid, signal.SIGSTOP)
work = ProcessKeyWork(first)

def reaped(pid):
    for _ in range(300):  # a cancelled step's worker is reaped by a thread of its own
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        time.sleep(0.01)
    return False

async def certificate(ca, asked, checkfirst):
    if checkfirst:  # a check before the first key was taken
        from agent.sds.keys import generate_key_and_csr
        kc = generate_key_and_csr(asked)
    else:
        kc = await work.new_key(asked, KeyType.EC_P256)
    crypto = "cryptography" in sys.modules
    from tests.support.testca import TestCA
    ca = ca or TestCA()
    cert = await work.check(ca.sign_csr(kc.csr_pem, 3600), kc.key_pem, None)
    return ca, crypto, cert

async def main():
    asked = "spiffe://cluster.local/ns/other/sa/x" if case == "other" else ident
    if case == "cancelled":  # the attempt timed out while the worker made its key
        task = asyncio.create_task(work.new_key(asked, KeyType.EC_P256))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    ca, crypto, cert = await certificate(None, asked, case == "checkfirst")
    out = {"crypto_after_key": crypto, "identity": cert.identity, "serial": cert.serial,
           "cpu": first.cpu_seconds, "reaped": reaped(pid)}
    # A rotation: the next certificate's key and check in a spawned worker.
    _, _, again = await certificate(ca, asked, False)
    out.update(rotated=again.identity == cert.identity and again.serial != cert.serial)
    await work.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def _run_worker(case: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, case, ID],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_the_forked_worker_makes_the_first_key_and_a_spawned_one_the_next() -> None:
    result = _run_worker("ok")
    # The key came from the worker: this process had not loaded cryptography for it.
    assert result["crypto_after_key"] is False
    assert result["identity"] == ID and isinstance(result["serial"], int)
    # Its one check answered, it exited and was reaped; its CPU is known.
    assert result["reaped"] is True
    assert isinstance(result["cpu"], float) and result["cpu"] > 0
    assert result["rotated"] is True


@pytest.mark.parametrize(
    ("case", "in_process"),
    [
        ("killed", True),
        ("stopped", True),
        ("other", False),
        ("checkfirst", True),
        ("cancelled", False),
    ],
)
def test_without_the_first_worker_the_steps_still_get_done(case: str, in_process: bool) -> None:
    """A worker that died or hangs (stopped: the reply times out and it is killed): the key
    and the check are made in this process. Asked for another identity, for a check while its
    first key was still waiting, or cancelled while making its key: it is closed (reaped),
    and a spawned worker does the step (the check-first case made its own key here)."""
    result = _run_worker(case)
    assert result["crypto_after_key"] is in_process
    assert result["identity"] == ("spiffe://cluster.local/ns/other/sa/x" if case == "other" else ID)
    assert result["reaped"] is True
    assert result["rotated"] is True


def test_the_worker_exits_when_its_agent_is_gone() -> None:
    """The parent exits without closing it (a crash): the worker reads EOF and exits."""
    script = textwrap.dedent(
        """
        import os, sys
        from agent.sds.workerproc import fork_key_worker
        pid, _ = fork_key_worker()
        print(pid, flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return  # exited; its new parent has not reaped it yet
        time.sleep(0.05)
    raise AssertionError(f"key worker {pid} still running after its parent exited")


def test_a_worker_loads_no_event_loop() -> None:
    """What a worker imports (agent/sds/workerproc.py, `serve`) is cryptography and the wire:
    asyncio alone would be ~20 ms more of its CPU, on the core Envoy starts on."""
    script = (
        "import sys\n"
        "from agent.sds import certcheck, keys, keywire, workerproc\n"
        "print(sorted(m for m in ('asyncio', 'grpc', 'google.protobuf') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_worker_left_mid_answer_exits_without_a_traceback() -> None:
    """The agent closes its end while a spawned worker is making the key (a cancelled step):
    the worker's write fails, and it exits 1 with nothing on the agent's stderr."""
    script = textwrap.dedent(
        """
        import os
        from agent.sds.keyspec import KeyType
        from agent.sds.keywire import encode, key_request
        from agent.sds.workerproc import spawn_key_worker
        pid, sock = spawn_key_worker()
        sock.sendall(encode(key_request("spiffe://cluster.local/ns/a/sa/b", KeyType.EC_P256)))
        sock.close()
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "1"
    assert out.stderr == ""
