"""The suite's socket guard (tests/conftest.py): only loopback addresses can be reached."""

import socket

import pytest


def test_a_connection_off_this_machine_is_refused_at_once():
    with socket.socket() as sock, pytest.raises(RuntimeError, match="only reach 127.0.0.1"):
        sock.connect(("93.184.216.34", 80))


def test_loopback_still_connects():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
