"""The OpenAI-compatible chat client against a real HTTP server on 127.0.0.1, faults injected."""

import signal
import socket
import threading
import time

import pytest

from r3rag.generation.openai_client import ChatClient
from r3rag.util.errors import UserError
from tests.chat_server import ChatServer, first_n, last_user_text

MSG = [{"role": "user", "content": "say hi"}]


def echo(body):
    return "echo: " + last_user_text(body)


def client(srv, **kw):
    kw = {"timeout": 5.0, "max_retries": 3, "backoff": 0.01, **kw}
    return ChatClient(srv.url, "m", **kw)


def test_replies_in_order_with_usage_params_and_key_header(monkeypatch):
    monkeypatch.setenv("TEST_CHAT_KEY", "sk-secret-123")
    with ChatServer(reply=echo) as srv, client(srv, api_key_env="TEST_CHAT_KEY", max_tokens=7) as c:
        reqs = [[{"role": "user", "content": f"q{i}"}] for i in range(5)]
        reqs[3] = {"messages": reqs[3], "temperature": 0.9}
        out = c.chat_many(reqs, temperature=0.0)
        assert [r.text for r in out] == [f"echo: q{i}" for i in range(5)]
        assert all(r.ok and r.finish_reason == "stop" and r.attempts == 1 for r in out)
        assert out[0].prompt_tokens == 1 and out[0].completion_tokens == 2
        bodies = sorted(srv.bodies(), key=last_user_text)
        assert [b["temperature"] for b in bodies] == [0.0, 0.0, 0.0, 0.9, 0.0]
        assert all(b["model"] == "m" and b["max_tokens"] == 7 for b in bodies)
        assert srv.requests[0]["headers"]["Authorization"] == "Bearer sk-secret-123"
        assert "sk-secret" not in repr(c) and "sk-secret" not in repr(out)
        assert c.stats.prompt_tokens == 5 and c.stats.completion_tokens == 10


def test_requests_run_concurrently_up_to_the_limit():
    with ChatServer(reply=echo, delay=0.2) as srv:
        with client(srv, concurrency=16) as c:
            t0 = time.monotonic()
            assert all(r.ok for r in c.chat_many([MSG] * 16))
            assert time.monotonic() - t0 < 1.0  # one after another would take 3.2 s
        with client(srv, concurrency=2) as c:
            t0 = time.monotonic()
            c.chat_many([MSG] * 4)
            assert time.monotonic() - t0 >= 0.4  # two rounds of two


@pytest.mark.parametrize("fault", ["500", "hang", "malformed", "truncated"])
def test_each_transient_fault_is_retried(fault):
    with ChatServer(reply=echo, faults=first_n([fault]), hang_seconds=10) as srv, client(srv, timeout=0.5) as c:
        r = c.chat(MSG)
        assert r.ok and r.text == "echo: say hi" and r.attempts == 2, r
        assert [q["fault"] for q in srv.requests] == [fault, None]
        assert sum(c.stats.errors.values()) == 1


def test_429_waits_for_retry_after():
    with ChatServer(reply=echo, faults=first_n(["429"]), retry_after="1") as srv, client(srv) as c:
        r = c.chat(MSG)
        assert r.ok and r.attempts == 2
        gap = srv.requests[1]["time"] - srv.requests[0]["time"]
        assert gap >= 1.0, gap  # backoff alone would be ~0.01 s
    with ChatServer(reply=echo, faults=first_n(["429"]), retry_after="300") as srv, client(srv) as c:
        r = c.chat(MSG)  # "not for 5 minutes": over the SDK's 2-minute limit, a failure now, not a long wait
        assert (r.kind, r.attempts, r.fatal) == ("http_429", 1, False)


def test_a_lasting_failure_is_a_value_and_others_still_succeed():
    def faults(body):
        return "500" if last_user_text(body) == "bad" else None

    with ChatServer(reply=echo, faults=faults) as srv, client(srv, max_retries=2) as c:
        out = c.chat_many([[{"role": "user", "content": t}] for t in ("a", "bad", "b")])
        assert [r.ok for r in out] == [True, False, True]
        assert out[1].kind == "http_500" and out[1].attempts == 3 and "after 3 attempts" in out[1].error
        assert not out[1].fatal and c.stats.failures == 1
        assert c.stats.errors == {"http_500": 3} and c.stats.attempts == 5
        assert out[1].seconds < 1.0  # backoff=0.01 is honoured: the SDK's own waits would be >= 1.1 s


def test_client_errors_are_not_retried_and_auth_is_fatal():
    with ChatServer(faults=first_n(["400", "401"])) as srv, client(srv, concurrency=1) as c:
        bad, auth = c.chat(MSG), c.chat(MSG)
        assert (bad.kind, bad.attempts, bad.fatal) == ("http_400", 1, False)
        assert (auth.kind, auth.attempts, auth.fatal) == ("http_401", 1, True)
    with ChatServer() as srv, ChatClient(srv.url.replace("/v1", "/v9"), "m") as c:  # a wrong URL: 404
        r = c.chat(MSG)
        assert (r.kind, r.attempts, r.fatal) == ("http_404", 1, True) and "/v9/chat/completions" in r.error


def test_connection_refused_is_a_failure_value():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ChatClient(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff=0.01) as c:
        r = c.chat(MSG)
        assert not r.ok and r.kind == "connection" and r.attempts == 2


def test_missing_key_variable_and_bad_url_are_user_errors(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(UserError, match="NO_SUCH_KEY_VAR is not set"):
        ChatClient("http://127.0.0.1:1/v1", "m", api_key_env="NO_SUCH_KEY_VAR")
    with pytest.raises(UserError, match="http"):
        ChatClient("127.0.0.1:1/v1", "m")


def test_no_key_sends_no_credentials_and_urls_and_extra_fields_pass_as_given(monkeypatch):
    for var in ("OPENAI_API_KEY", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):  # never picked up from the environment
        monkeypatch.setenv(var, "sk-from-env")
    with ChatServer(reply=echo) as srv, ChatClient(srv.url + "/chat/completions/", "m", top_k=5) as c:
        assert c.url == srv.url + "/chat/completions"
        r = c.chat(MSG, repetition_penalty=1.1, stop=None)
        assert r.ok and r.text == "echo: say hi", r
        [req] = srv.requests
    assert not any("sk-from-env" in v for v in req["headers"].values())
    assert req["headers"]["Authorization"] is None
    assert req["body"] == {"model": "m", "messages": MSG, "top_k": 5, "repetition_penalty": 1.1}  # None: left out


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C as a terminal delivers it: Python's default handler, SIGINT not blocked in the main
    thread, whatever an earlier test in this process left (once, in CI, the signal never arrived)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_cancels_the_requests_in_flight(ctrl_c_raises):
    main = threading.get_ident()
    with (
        ChatServer(reply=echo, faults=first_n(["hang"]), hang_seconds=30) as srv,
        client(srv, concurrency=1, timeout=20) as c,
    ):
        threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            c.chat(MSG)  # hangs until Ctrl-C
        r = c.chat(MSG)  # the only slot is free again: the hung request was cancelled, not left to time out
        assert r.ok and r.attempts == 1 and time.monotonic() - t0 < 5
