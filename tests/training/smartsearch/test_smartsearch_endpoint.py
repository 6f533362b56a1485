"""SmartSearch judge and refiner against any OpenAI-compatible endpoint in its own format (a real local HTTP server
returning scripted chat replies: the exact path, model, messages, budgets and non-thinking switch are checked), the
demo preset's one-override switch to such an endpoint, and the rule judge/refiner stand-ins."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from evaluation.benchmarks import Question
from training.protocols.base import TurnState
from training.rewards.smartsearch import smartsearch_round_prefixes
from training.smartsearch.config import EndpointSpec, JudgeSpec, RefinerSpec, SmartSearchConfig
from training.smartsearch.endpoint import EndpointClient
from training.smartsearch.judge import GoldSupport, RuleJudge, UsefulnessJudge, judge_text, make_judge
from training.smartsearch.refine import REFINE_TEMPLATE, process_with_result, refine_rounds

REPO = Path(__file__).resolve().parents[3]


class ScriptedChat(BaseHTTPRequestHandler):
    """A chat-only OpenAI-compatible server: ``GET /v1/models`` names one model; ``POST /v1/chat/completions``
    answers a judge prompt with a Qwen3 non-thinking reply and a refiner prompt with a multi-line query."""

    log: list[tuple[str, str, dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.log.append(("GET", self.path, {}))
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.log.append(("POST", self.path, body))
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"{self.path}: chat only"}})
            return
        user = body["messages"][-1]["content"]
        if "query-evaluation" in user:
            text = "<think>\n\n</think>\n\n<answer> 0 </answer><explanation> the result names another film's " \
                   "director, not Ed Wood's, so the intent is not answered </explanation>"
        else:
            text = "<think>\n\n</think>\n\n<search>\nEd Wood 1994 film\ndirector\n"  # the server stopped at </search>
        self._send(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}]})


@pytest.fixture
def chat_server() -> Iterator[str]:
    ScriptedChat.log = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _turn(query: str, doc_id: str, doc: str) -> TurnState:
    return TurnState(generated=f" Let me look. </think>\n<search> {query} </search>", query=query, doc_ids=[doc_id],
                     doc_texts=[doc], scores=[1.0], inserted=f"<result>result: \n{doc}\n</result>\n",
                     finish_reason="stop", stop="</search>", tokens=8)


def _traj() -> SimpleNamespace:
    turns = [_turn("who directed Ed Wood", "d-wrong", "Plan 9 from Outer Space was directed by Ed Wood."),
             TurnState(generated="<think> Done. </think>\n<answer> \\boxed{Tim Burton} </answer>", tokens=9)]
    response = "".join(t.generated + t.inserted for t in turns)
    return SimpleNamespace(question_id="q1", question="Who directed the film Ed Wood?", golden_answers=["Tim Burton"],
                           dataset="t", sample=0, prompt="P", response=response, turns=turns)


def test_judge_and_refiner_speak_chat_to_any_endpoint(chat_server: str) -> None:
    """The issue's case: a strong endpoint behind a URL got /v1/completions, model "smollm2", SmolLM2's template
    and 24 tokens. Now: /v1/chat/completions, the server's own model name (GET /models), one user message (the
    server applies its own chat template), the seed's 2048-token budgets and Qwen3 non-thinking switch."""
    spec = EndpointSpec(base_url=chat_server, enable_thinking=False)
    client = EndpointClient(spec)
    judge = UsefulnessJudge(client, JudgeSpec())
    traj = _traj()
    [rounds] = judge.judge_trajectories([traj])
    assert [r.verdict for r in rounds] == [0] and rounds[0].explanation.startswith("the result names another")
    refiner = RefinerSpec()
    [ref] = refine_rounds(client, refiner, [traj], [rounds], 1)
    assert ref.refined_query == "Ed Wood 1994 film director"  # a query over lines, cut by the stop, parsed whole

    log = ScriptedChat.log
    assert [(m, p) for m, p, _ in log] == [("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                                           ("POST", "/v1/chat/completions")]
    [prefix] = smartsearch_round_prefixes(judge_text(traj.response))
    assert prefix.endswith("Ed Wood.\n</result>")
    judged, refined = log[1][2], log[2][2]
    assert judged == {"model": "Qwen/Qwen3-8B", "temperature": 0.6, "max_tokens": 2048,
                      "messages": [{"role": "user", "content": judge.prompt(traj.question, ["Tim Burton"], prefix)}],
                      "chat_template_kwargs": {"enable_thinking": False}}
    assert "Plan 9 from Outer Space" in judged["messages"][0]["content"]
    issues = rounds[0].explanation
    assert refined == {"model": "Qwen/Qwen3-8B", "temperature": 0.6, "max_tokens": 2048, "stop": ["</search>"],
                       "messages": [{"role": "user", "content": REFINE_TEMPLATE.format(
                           question=traj.question, process=process_with_result(traj, 0), issues=issues)}],
                       "chat_template_kwargs": {"enable_thinking": False}}
    # the refiner sees the current round's result, as the seed's does (and is told not to rely on it)
    assert "Plan 9 from Outer Space" in refined["messages"][0]["content"]
    assert "SmolLM" not in json.dumps(log)  # no local chat template anywhere


def test_demo_preset_switches_to_an_endpoint_with_one_override() -> None:
    """``endpoint.base_url=... endpoint.serve_model=null`` on the CPU demo: chat mode, the server's model name and
    the seed's budgets; the served SmolLM2 keeps completions mode and its small cap."""
    raw = yaml.safe_load((REPO / "flows/configs/smartsearch_cpu_demo.yaml").read_text())
    served = SmartSearchConfig.model_validate(raw)
    assert served.endpoint.resolved_mode() == "completions" and served.endpoint.served
    assert served.endpoint.reply_budget(served.refiner.max_tokens) == served.endpoint.serve_max_tokens
    raw["endpoint"] |= {"base_url": "http://judge:9001/v1", "serve_model": None}
    remote = SmartSearchConfig.model_validate(raw)
    assert remote.endpoint.resolved_mode() == "chat" and remote.endpoint.model is None
    assert remote.endpoint.reply_budget(remote.judge.max_tokens) == 2048
    assert remote.endpoint.reply_budget(remote.refiner.max_tokens) == 2048
    paper = SmartSearchConfig.model_validate(
        yaml.safe_load((REPO / "flows/configs/smartsearch_paper.yaml").read_text()))
    assert paper.endpoint.enable_thinking is False  # the seed's Qwen3 judge is forced into non-thinking mode
    assert paper.stage1.mask_retrieved is False  # the seed's SFT trains on the whole turn


def test_reasoning_block_is_removed_before_the_verdict() -> None:
    from training.smartsearch.endpoint import strip_reasoning
    from training.smartsearch.judge import parse_verdict

    reply = "<think>The query asks for <answer> maybe </answer>...</think>\n<answer> 1 </answer><explanation>ok"
    assert parse_verdict(strip_reasoning(reply))[0] == 1
    assert strip_reasoning("<answer>0</answer>") == "<answer>0</answer>"


def _rule_traj(*rounds: tuple[str, str, str]) -> SimpleNamespace:
    turns = [_turn(q, d, text) for q, d, text in rounds]
    turns.append(TurnState(generated="<think> ok </think>\n<answer> \\boxed{a spirit} </answer>", tokens=5))
    return SimpleNamespace(question_id="h1", question="If Gallu is a demon Lilu is what?", golden_answers=["a spirit"],
                           dataset="hotpotqa", sample=0, prompt="P", turns=turns,
                           response="".join(t.generated + t.inserted for t in turns))


def test_rule_judge_is_gold_informed_and_deterministic() -> None:
    q = Question(id="h1", question="If Gallu is a demon Lilu is what?", golden_answers=["a spirit"],
                 supporting_doc_ids=["trw-5", "trw-9"], metadata={"supporting_titles": ["Alû", "Lilu (mythology)"]})
    support = GoldSupport([q])
    judge = make_judge(JudgeSpec(kind="rule"), None, support)
    assert isinstance(judge, RuleJudge)
    traj = _rule_traj(("Gallu demon", "trw-5", "Alû is a demon."),              # gold supporting paragraph
                      ("Lilu", "x-1", "In Akkadian myth Lilu is a spirit."),      # contains the gold answer
                      ("Sumerian gods", "x-2", "Anu is a sky god."))              # neither
    [rounds] = judge.judge_trajectories([traj])
    assert [r.verdict for r in rounds] == [1, 1, 0] and [r.low_quality for r in rounds] == [False, False, True]
    assert "trw-5" in rounds[0].explanation and "neither" in rounds[2].explanation
    assert judge(traj.question, traj.response, traj.golden_answers) == [True, True, False]  # the reward's view
    assert judge.stats["rounds"] == 3 and judge.stats["not_useful"] == 1 and judge.stats["failed"] == 0
    # yes/no golds never match a document; an unknown question has only the answer rule
    yes = RuleJudge()
    assert yes.verdict(["d"], ["No, yes, maybe."], ["yes"], [])[0] == 0
    # the rule refiner: the first gold title not retrieved before the round
    refs = refine_rounds(None, RefinerSpec(kind="rule"), [traj], [rounds], 1, support)
    assert [(r.round, r.refined_query) for r in refs] == [(2, "Lilu (mythology)")]
    first = refine_rounds(None, RefinerSpec(kind="rule"), [traj],
                          [[rounds[0].model_copy(update={"verdict": 0, "low_quality": True})]], 1, support)
    assert first[0].refined_query == "Alû"
