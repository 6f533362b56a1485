"""SmartSearch usefulness judge: verdict parsing (junk included), the OpenAI-compatible client (retries, failed
calls counted, never raised), per-round verdicts with redundancy and the RoundScorer interface in the reward."""

from __future__ import annotations

import json

import httpx
import pytest

from training.rewards.smartsearch import smartsearch_reward
from training.smartsearch.config import EndpointSpec, JudgeSpec
from training.smartsearch.endpoint import EndpointClient
from training.smartsearch.judge import UsefulnessJudge, load_template, parse_verdict


@pytest.mark.parametrize(("text", "verdict"), [
    ("<answer> 1 </answer><explanation>found it</explanation>", 1),
    ("<answer>0</answer><explanation>wrong entity</explanation>", 0),
    ("<answer> 1. </answer>", 1),
    ("<answer>1", 1),                                   # truncated after the digit
    ("<answer> 1 <explanation>no closing tag", 1),
    ("<ANSWER> 0 </ANSWER>", 0),
    ("<answer> 1 or 0 </answer>", None),                # junk: both
    ("<answer> yes </answer>", None),
    ("<answer> 10 </answer>", None),
    ("<answer></answer>", None),
    ("The score is 1.", None),                          # no tag at all
    ("", None),
    ("<answer> 2 </answer>", None),
])
def test_parse_verdict_accepts_only_a_single_binary_digit(text: str, verdict: int | None) -> None:
    assert parse_verdict(text)[0] == verdict


def test_parse_verdict_reads_the_explanation() -> None:
    assert parse_verdict("<answer> 0 </answer><explanation> wrong person </explanation>") == (0, "wrong person")


def test_own_template_must_hold_every_field(tmp_path) -> None:
    good = tmp_path / "t.txt"
    good.write_text("Q {question} A {golden_answers} P {process}")
    assert load_template(str(good), "x", ("question", "golden_answers", "process")).startswith("Q ")
    bad = tmp_path / "bad.txt"
    bad.write_text("Q {question}")
    with pytest.raises(ValueError, match="golden_answers"):
        load_template(str(bad), "x", ("question", "golden_answers", "process"))
    with pytest.raises(FileNotFoundError):
        load_template(str(tmp_path / "missing.txt"), "x", ("question",))


class FakeJudgeServer:
    """An OpenAI-compatible chat endpoint (httpx MockTransport): answers by a rule on the prompt, fails the first
    request with a 503 (to exercise retries) and answers junk for prompts containing 'JUNK'."""

    def __init__(self) -> None:
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.requests == 1:
            return httpx.Response(503, json={"error": {"message": "warming up"}})
        body = json.loads(request.content)
        prompt = body["messages"][0]["content"]
        process = prompt.split("Search process so far:")[-1]
        last = process.rsplit("<search>", 1)[-1]
        if "JUNK" in last:
            text = "I think it is probably fine"
        else:
            text = f"<answer> {1 if 'Paris' in last else 0} </answer><explanation>checked</explanation>"
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": text}}]})


def _response(*rounds: tuple[str, str]) -> str:
    out = " I need to search. </think>"
    for query, doc in rounds:
        out += f"\n<search> {query} </search><result>result: \n{doc}\n\n</result>\n<think> ok </think>"
    return out + "\n<answer> \\boxed{Paris} </answer>"


@pytest.fixture
def judge() -> UsefulnessJudge:
    spec = EndpointSpec(base_url="http://judge.test/v1", model="j", retries=3, concurrency=2)
    client = EndpointClient(spec, transport=httpx.MockTransport(FakeJudgeServer()))
    return UsefulnessJudge(client, JudgeSpec(max_redundancy=1))


def test_judge_rounds_with_retry_junk_and_redundancy(judge) -> None:
    from types import SimpleNamespace

    resp = _response(("capital of France", '"France"\nParis is the capital.'),
                     ("JUNK query", '"France"\nParis is the capital.'),
                     ("Paris population", '"France"\nParis is the capital.\n\n"Lyon"\nCity.\n\n"Nice"\nCity.'))
    traj = SimpleNamespace(question_id="q", sample=0, question="Capital of France?", golden_answers=["Paris"],
                           response=resp)
    [rounds] = judge.judge_trajectories([traj])
    assert [r.verdict for r in rounds] == [1, None, 1]
    assert rounds[1].error == "unparseable verdict" and "probably fine" in rounds[1].raw
    assert [r.redundancy for r in rounds] == [0, 1, 1]
    assert [r.low_quality for r in rounds] == [False, False, False]
    assert judge.stats["failed"] == 1 and judge.stats["useful"] == 2
    # the reward's RoundScorer view: a failed call counts good; cached verdicts, no new requests
    calls = judge.client.calls
    assert judge("Capital of France?", resp, ["Paris"]) == [True, None, True]
    assert judge.client.calls == calls and judge.stats["cached"] >= 3
    assert smartsearch_reward(resp, ["Paris"], "Capital of France?", scorers=(judge,)).parts["bad_rounds"] == 0


def test_judge_zero_makes_a_round_bad_in_the_reward(judge) -> None:
    resp = _response(("Eiffel tower height", '"Tower"\n330 m.'))
    r = smartsearch_reward(resp, ["Paris"], "Capital of France?", scorers=(judge,))
    assert r.parts["bad_rounds"] == 1 and r.parts["outcome"] == 1.0 and r.score == pytest.approx(0.9 + 0.1)


def test_unreachable_endpoint_is_a_failed_call_not_an_exception() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    spec = EndpointSpec(base_url="http://judge.test/v1", model="j", retries=2)
    client = EndpointClient(spec, transport=httpx.MockTransport(refuse))
    [reply] = client.complete(["hello"])
    assert reply.text == "" and "ConnectError" in reply.error and client.failures == 1


def test_endpoint_needs_a_url_or_a_model_to_serve() -> None:
    with pytest.raises(ValueError, match="base_url"):
        EndpointSpec()


def test_read_timeout_is_a_failed_call_without_resend() -> None:
    seen = []

    def slow(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        raise httpx.ReadTimeout("slow judge")

    client = EndpointClient(EndpointSpec(base_url="http://judge.test/v1", model="j", retries=3),
                            transport=httpx.MockTransport(slow))
    [reply] = client.complete(["hello"])
    assert "ReadTimeout" in reply.error and len(seen) == 1 and client.failures == 1


def test_every_reply_the_default_template_shows_parses_to_a_verdict() -> None:
    # A small judge copies the format line: the old `<answer> 0 or 1 </answer>` placeholder made every one of
    # SmolLM2-135M's replies unparseable in the CPU demo. Each reply the template shows must itself be a verdict.
    import re

    from training.smartsearch.judge import JUDGE_TEMPLATE, parse_verdict

    shown = re.findall(r"<answer>[^<]*</answer>", JUDGE_TEMPLATE)
    assert shown, "the template shows no <answer> reply"
    assert sorted(parse_verdict(reply)[0] for reply in shown) == [0, 1]
