"""The sender keeps one connection open per thread, and a kept-open connection the server has closed
(its keep-alive timeout) is opened again for the next sample, without using one of its attempts:
whether the sender sees the close before sending or only when the request meets it. The health
gate sees a running server by /server_info at once, and by /health otherwise."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from hsextract.client.sender import HealthGate, Sender
from hsextract.errors import HsextractError
from hsextract.retry import RetryPolicy
from support.answering_server import AnsweringServer

pytestmark = pytest.mark.timeout(60)


class OneShotServer:
    """A /generate server on a raw socket: answers ``per_connection`` requests on each connection,
    then closes it without saying so (as a keep-alive timeout does), and counts connections."""

    def __init__(self, per_connection: int):
        self.per_connection = per_connection
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.answered = 0
        self.closed = threading.Event()  # set each time the server has closed a connection
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            reader = conn.makefile("rb")
            for _ in range(self.per_connection):
                length, request = 0, reader.readline()
                if not request:  # the client closed the connection
                    break
                while (line := reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                if request.startswith(b"GET /health"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    continue
                body = json.loads(reader.read(length))
                answer = json.dumps(
                    {"meta_info": {"prompt_tokens": len(body["input_ids"]), "finish_reason": {"type": "length"}}}
                ).encode()
                self.answered += 1  # counted before the client can read it
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )
            reader.close()
            conn.close()
            self.closed.set()

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def server(request):
    srv = OneShotServer(request.param)
    yield srv
    srv.stop()


@pytest.mark.parametrize("server", [1000], indirect=True)
def test_samples_of_one_thread_go_out_on_one_kept_open_connection(server):
    sender = Sender(server.url, RetryPolicy(max_attempts=1))
    results = [sender.send(f"hsx-r-{i}", [1, 2, 3, i]) for i in range(20)]
    assert all(r.ok and r.attempts == 1 for r in results)
    assert server.connections == 1


@pytest.mark.parametrize("server", [1], indirect=True)
def test_an_idle_connection_the_server_closed_is_opened_again_without_using_an_attempt(server):
    sender = Sender(server.url, RetryPolicy(max_attempts=1))
    first = sender.send("hsx-r-0", [1, 2, 3])
    assert first.ok
    assert server.closed.wait(10), "the server did not close the connection"
    second = sender.send("hsx-r-1", [4, 5, 6, 7])
    assert second.ok and second.attempts == 1, second
    assert server.connections == 2 and server.answered == 2


def test_a_server_url_that_is_not_http_stops_the_run_at_once():
    with pytest.raises(HsextractError, match="expected http://HOST:PORT"):
        Sender("localhost:30000")


@pytest.fixture
def info_server(request):
    srv = AnsweringServer(gets=request.param)
    yield srv
    srv.close()


@pytest.mark.parametrize("info_server", [("/server_info",)], indirect=True)
def test_a_server_that_answers_server_info_is_up_without_asking_health(info_server):
    gate = HealthGate(info_server.url, RetryPolicy())
    assert gate.up_now()
    assert info_server.requests == [("GET", "/server_info")]


@pytest.mark.parametrize("info_server", [("/health",)], indirect=True)
def test_a_server_without_server_info_is_not_taken_as_up_until_health_says_so(info_server):
    gate = HealthGate(info_server.url, RetryPolicy())
    assert not gate.up_now()
    assert gate.probe()


def test_a_server_that_is_not_listening_is_neither_up_nor_healthy():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        gate = HealthGate(url, RetryPolicy(connect_timeout_s=2))
        assert not gate.up_now()
        assert not gate.probe()
