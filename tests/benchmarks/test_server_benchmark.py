"""The retriever benchmark's Search-R1 anchor: the launcher runs an upstream server file on CPU with only the device
lines changed from outside (no copy of their code), and the load generator speaks both request shapes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import searchr1_server_cpu  # noqa: E402
import server_throughput  # noqa: E402

# a stand-in for their file: the same device calls and uvicorn.run(host="0.0.0.0", port=8000) in __main__
FAKE_SERVER = '''
import sys, torch, uvicorn
model = torch.nn.Linear(2, 2)
model.cuda()
model = model.half()
x = torch.ones(2).cuda()
corpus = open(sys.argv[sys.argv.index("--corpus_path") + 1]).read()
sys.modules["searchr1_seen"] = (next(model.parameters()).dtype, x.device.type, sys.argv[1:], corpus)
if __name__ == "__main__":
    uvicorn.run("app", host="0.0.0.0", port=8000)
'''


def test_request_shapes() -> None:
    path, body = server_throughput.request_of("searchr1", "who?", 3)
    assert path == "/retrieve" and orjson.loads(body) == {"queries": ["who?"], "topk": 3, "return_scores": True}
    path, body = server_throughput.request_of("ours", "who?", 3)
    assert path == "/search" and orjson.loads(body) == {"query": "who?", "top_n": 3}


def test_launcher_runs_their_file_on_cpu_on_loopback(tmp_path, monkeypatch) -> None:
    import torch
    import uvicorn

    upstream = tmp_path / "Search-R1"
    (upstream / "search_r1" / "search").mkdir(parents=True)
    (upstream / "search_r1" / "search" / "retrieval_server.py").write_text(FAKE_SERVER)
    index = tmp_path / "index"
    index.mkdir()
    (index / "index.faiss").write_bytes(b"")
    (index / "passages.jsonl").write_text(json.dumps({"id": "p0", "title": "T", "text": "body"}) + "\n")
    calls: list[tuple] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    for obj, name in ((torch.nn.Module, "cuda"), (torch.Tensor, "cuda"), (torch.nn.Module, "half")):
        monkeypatch.setattr(obj, name, getattr(obj, name))  # restored after the test
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert searchr1_server_cpu.main(["--upstream", str(upstream), "--index-dir", str(index), "--port", "8123",
                                     "--topk", "2"]) == 0
    dtype, device, argv, corpus_text = sys.modules.pop("searchr1_seen")
    assert dtype == torch.float32 and device == "cpu"
    assert argv[argv.index("--topk") + 1] == "2" and argv[argv.index("--retriever_name") + 1] == "minilm"
    assert json.loads(corpus_text) == {"id": "p0", "contents": "T\nbody"}
    assert not Path(argv[argv.index("--corpus_path") + 1]).exists()  # the exported corpus is removed afterwards
    assert calls == [("app", {"host": "127.0.0.1", "port": 8123, "log_level": "warning"})]


def test_launcher_names_the_missing_checkout(tmp_path) -> None:
    with pytest.raises(SystemExit, match="PeterGriffinJin/Search-R1"):
        searchr1_server_cpu.main(["--upstream", str(tmp_path), "--index-dir", str(tmp_path), "--port", "1"])


def test_server_variants_override_only_what_they_name() -> None:
    import argparse

    base = argparse.Namespace(workers=2, max_batch=32, max_wait_ms=2.0, torch_threads=1)
    got = server_throughput.parse_variants("wait=10, workers=1/max_batch=64/torch_threads=2", base)
    assert got == {"server_wait10": {"workers": 2, "max_batch": 32, "wait": 10.0, "torch_threads": 1},
                   "server_workers1_max_batch64_torch_threads2": {"workers": 1, "max_batch": 64, "wait": 2.0,
                                                                  "torch_threads": 2}}
    assert server_throughput.parse_variants(None, base) == {}
    with pytest.raises(SystemExit, match="threads=2"):
        server_throughput.parse_variants("threads=2", base)
    with pytest.raises(SystemExit, match="wait=abc"):
        server_throughput.parse_variants("wait=abc", base)
