"""``--ray ADDRESS`` (shardplan/_workers.py): what is an address, and one line for what is not
(issue 38). No Ray needed: a malformed address is refused before Ray is imported."""

from __future__ import annotations

import socket

import pytest

from shardplan import _workers
from shardplan._workers import RayExecutor, _check_reachable, ray_address
from shardplan.errors import ShardplanError
from shardplan.generate import layered
from shardplan.ir import save
from tests.helpers import run_cli

BAD = [
    "host:port",       # a port that is not a number
    ":1234",           # an empty host
    "host:",           # no port
    "host",            # no port at all
    "",
    "ray://",
    "host:0",          # ports are 1..65535
    "host:65536",
    "host:99999999999999999999",
    "host:-1",
    "host:+80",
    "host:1_000",
    "host:\u00b2",     # a digit to str.isdigit, not to int()
    "host:\u0661\u0662",  # Arabic-Indic digits: int() takes them, a socket would not
    " host:80",        # whitespace anywhere
    "host:80 ",
    "ho st:80",
    "host:8 0",
    "host\t:80",
    "host\n:80",
    "::1:6379",        # IPv6 without brackets: where does the host end?
    "[::1]",           # no port
    "[::1]:",
    "[]:80",           # an empty IPv6 host
    "[host]:80",       # brackets are for IPv6 hosts
    "[::1:80",
    "::1]:80",
    "a/b:80",
    "LOCAL",
    "Auto",
]

GOOD = [
    ("local", None),
    ("auto", None),
    ("127.0.0.1:6379", ("127.0.0.1", 6379)),
    ("head-node.example:10001", ("head-node.example", 10001)),
    ("ray://10.0.0.2:10001", ("10.0.0.2", 10001)),
    ("localhost:1", ("localhost", 1)),
    ("localhost:65535", ("localhost", 65535)),
    ("[::1]:6379", ("::1", 6379)),
    ("ray://[fe80::1]:10001", ("fe80::1", 10001)),
]


@pytest.mark.parametrize("address", BAD)
def test_malformed_addresses_are_one_line(address):
    with pytest.raises(ShardplanError, match="expects local, auto or HOST:PORT") as info:
        ray_address(address)
    assert "\n" not in str(info.value) and repr(address) in str(info.value)


@pytest.mark.parametrize("address, want", GOOD)
def test_addresses(address, want):
    assert ray_address(address) == want


@pytest.mark.parametrize("address", [":1234", "host:port", "host:99999"])
def test_the_executor_refuses_them_with_or_without_ray(address):
    with pytest.raises(ShardplanError, match="expects local, auto or HOST:PORT"):
        RayExecutor(address, 1)


def test_reachability_is_checked_at_the_parsed_host_and_port(monkeypatch):
    seen = []

    class _Conn:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            seen.append("closed")

    def connect(target, timeout):
        seen.append((target, timeout))
        if target[1] == 1:
            raise ConnectionRefusedError(111, "Connection refused")
        return _Conn()

    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(_workers, "_speaks_http2", lambda conn: True)  # a gRPC server
    _check_reachable("ray://[::1]:6379")
    _check_reachable("local")
    _check_reachable("auto")
    assert seen == [(("::1", 6379), 5), "closed"]
    with pytest.raises(ShardplanError, match=r"cannot reach the Ray cluster at 'h:1': "
                                             r"Connection refused$"):
        _check_reachable("h:1")
    with pytest.raises(ShardplanError, match="expects local, auto or HOST:PORT"):
        _check_reachable("h:0")


@pytest.mark.parametrize("address", [":1234", "host:port", "host:", "host:70000", " h:1",
                                     "::1:80"])
@pytest.mark.parametrize("command", ["plan", "partition"])
def test_cli_refuses_them_in_one_line(tmp_path, capsys, address, command):
    g = layered(num_nodes=8, width=2, seed=0)
    save(g, tmp_path / "g.json")
    if command == "plan":
        argv = ["plan", str(tmp_path / "g.json"), "--cluster", "flat,num_devices=2"]
    else:
        argv = ["partition", str(tmp_path / "g.json"), str(tmp_path / "t.json"),
                "--algorithm", "heuristic"]
    assert run_cli([*argv, "--ray", address]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error: argument --ray: expects local, auto or HOST:PORT")
    assert err.count("\n") == 1 and repr(address) in err


@pytest.mark.parametrize("address, want", [("XX:1", ("XX", 1)),
                                           ("ray://NODE-X.example:6379",
                                            ("NODE-X.example", 6379))])
def test_hosts_may_have_any_letters(address, want):
    assert ray_address(address) == want


def test_the_greeting_goes_over_the_connection_to_the_address(monkeypatch):
    """The HTTP/2 check is made on the connection opened to the address, and a peer that
    does not answer it is one line naming the address and the wait."""
    conn = object()
    seen = []

    class _Open:
        def __enter__(self):
            return conn

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(socket, "create_connection", lambda target, timeout: _Open())

    def speaks(c):
        seen.append(c)
        return False

    monkeypatch.setattr(_workers, "_speaks_http2", speaks)
    with pytest.raises(ShardplanError) as info:
        _check_reachable("h:6379")
    assert seen == [conn]
    assert str(info.value) == (
        "cannot reach the Ray cluster at 'h:6379': something listens there but does not "
        "answer as Ray's gRPC server does (within 5 s)")


def _peer(answer: bytes | None, *, close: bool = False):
    """A connected socket pair; the far end answers ``answer`` (None: nothing) and may then
    close. Returns (our end, the far end, what the far end received)."""
    ours, theirs = socket.socketpair()
    if answer:
        theirs.sendall(answer)
    if close:
        theirs.shutdown(socket.SHUT_WR)
    return ours, theirs


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("answer, close, want", [
    (bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]), False, True),          # an empty SETTINGS frame
    (bytes([0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]), False, True),  # with a value
    (bytes([0, 0, 0, 7, 0, 0, 0, 0, 0]), False, False),         # GOAWAY: not SETTINGS
    (b"HTTP/1.1 400 Bad Request\r\n", False, False),            # another protocol
    (bytes([0, 0, 0, 4]), True, False),                         # closed mid-frame
    (b"", True, False),                                         # closed at once
])
def test_an_http2_peer_is_one_that_answers_settings(monkeypatch, answer, close, want):
    monkeypatch.setattr(_workers, "_ANSWER_SECONDS", 2.0)
    ours, theirs = _peer(answer, close=close)
    with ours, theirs:
        assert _workers._speaks_http2(ours) is want
        assert ours.gettimeout() == 2.0
        theirs.settimeout(2.0)
        got = b""
        while len(got) < len(_PREFACE):
            got += theirs.recv(len(_PREFACE) - len(got))
        assert got == _PREFACE  # the client greeting, byte for byte


def test_a_frame_header_arriving_in_pieces_is_read_whole():
    ours, theirs = _peer(None)
    with ours, theirs:
        import threading

        def dribble():
            for b in bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]):
                theirs.sendall(bytes([b]))

        t = threading.Thread(target=dribble)
        t.start()
        assert _workers._speaks_http2(ours) is True
        t.join()


def test_a_silent_peer_answers_false_after_the_wait(monkeypatch):
    monkeypatch.setattr(_workers, "_ANSWER_SECONDS", 0.05)
    ours, theirs = _peer(None)
    with ours, theirs:
        assert _workers._speaks_http2(ours) is False
