"""LLM-as-judge accuracy (ACC_L) against any OpenAI-compatible chat-completions endpoint.

Two judge prompts, paraphrased from the seeds: ``"research"`` (ReSearch ``llm_judge.py``: JSON with a rationale
and a judgement correct/incorrect; the prediction must be semantically equal to at least one gold) and
``"r1searcher"`` (R1-Searcher ``metric_calc_gpt_as_judge.py``: True/False, correct only when it fully aligns
with the meaning and key information of the golden answer). Both seeds use gpt-4o-mini at temperature 0.

The endpoint comes from a :class:`JudgeConfig` or the environment (``SEARCHLOOP_JUDGE_BASE_URL``,
``SEARCHLOOP_JUDGE_MODEL``, ``SEARCHLOOP_JUDGE_API_KEY`` or ``OPENAI_API_KEY``). With no endpoint the judge is
skipped and the result says how to enable it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from infra.config import StrictModel, secret_value

log = logging.getLogger(__name__)

JudgePrompt = Literal["research", "r1searcher"]
JUDGE_PROMPTS: tuple[str, ...] = ("research", "r1searcher")
"""The judge prompt styles; a protocol names its seed's in ``SearchProtocol.judge_prompt``."""

RESEARCH_PROMPT = """You are given a question, a list of ground-truth answers (each item on its own is a correct \
answer) and a predicted answer. Decide whether the predicted answer correctly answers the question. It does not \
have to match a ground-truth answer word for word, but for this question it must mean the same thing as at least \
one of them. Explain your reasoning first, then give your verdict.

question: {question}
ground-truth answers: {golds}
predicted answer: {prediction}

Reply with a JSON object only, in this form:
{{"rationale": "<your reasoning>", "judgement": "correct" or "incorrect"}}"""

R1SEARCHER_PROMPT = """Given a Question and its Golden Answer, decide whether the Predicted Answer is correct. \
Count it as correct only if it fully aligns with the meaning and key information of the Golden Answer. Reply \
True if the prediction is correct and False if it is not.

Question: {question}
Golden Answer: {golds}
Predicted Answer: {prediction}"""

SKIP_MESSAGE = (
    "LLM judge (ACC_L) skipped: no endpoint configured. Set SEARCHLOOP_JUDGE_BASE_URL (an OpenAI-compatible "
    "base URL ending in /v1) and SEARCHLOOP_JUDGE_MODEL, plus SEARCHLOOP_JUDGE_API_KEY if the server needs one."
)


class JudgeConfig(StrictModel):
    """Where and how to ask the judge model."""

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Judge model name as the server knows it (the seeds use gpt-4o-mini).")
    api_key: SecretStr | None = Field(
        default=None, description="Bearer token (recorded as '**********'); unset: SEARCHLOOP_JUDGE_API_KEY or "
        "OPENAI_API_KEY from the environment, else no Authorization header.")
    prompt: JudgePrompt = Field(default="research", description="Judge prompt: 'research' (JSON) or 'r1searcher'.")
    temperature: float = Field(default=0.0, description="Sampling temperature (the seeds use 0).")
    max_tokens: int = Field(default=1024, description="Completion token limit per judgement.")
    json_mode: bool = Field(default=True, description="Ask for response_format json_object ('research' prompt).")
    timeout_s: float = Field(default=60.0, description="Per-request timeout in seconds.")
    max_retries: int = Field(default=4, description="Retries on connection errors, 429 and 5xx.")
    concurrency: int = Field(default=8, description="Parallel requests.")


class JudgeItem(BaseModel):
    """One prediction to judge."""

    model_config = ConfigDict(frozen=True)

    question: str = Field(description="Question text.")
    golden_answers: list[str] = Field(description="Accepted answers.")
    prediction: str = Field(description="The system's answer.")


class JudgeVerdict(BaseModel):
    """The judge's decision on one item (``correct`` is None when no verdict could be obtained)."""

    model_config = ConfigDict(frozen=True)

    correct: bool | None = Field(description="True/False, or None when the call or parsing failed.")
    raw: str = Field(default="", description="The judge's raw reply.")
    error: str | None = Field(default=None, description="Why there is no verdict.")


class JudgeResult(BaseModel):
    """Verdicts for a list of items, or the reason the judge was skipped."""

    model_config = ConfigDict(frozen=True)

    skipped: bool = Field(description="True when no endpoint was configured.")
    message: str = Field(default="", description="Skip reason or a summary.")
    verdicts: list[JudgeVerdict] = Field(default_factory=list, description="One per item, in order.")

    @property
    def scores(self) -> list[float | None]:
        """Per-item 1.0/0.0, None where the judge gave no verdict."""
        return [None if v.correct is None else float(v.correct) for v in self.verdicts]

    @property
    def accuracy(self) -> float | None:
        """Correct / all items (failed items count as incorrect, as the seeds' totals do); None if skipped."""
        if self.skipped or not self.verdicts:
            return None
        return sum(1 for v in self.verdicts if v.correct) / len(self.verdicts)


def judge_config_from_env(prompt: JudgePrompt = "research") -> JudgeConfig | None:
    """Build a config from ``SEARCHLOOP_JUDGE_*`` variables; None when base URL or model is unset."""
    base_url = os.environ.get("SEARCHLOOP_JUDGE_BASE_URL", "").strip()
    model = os.environ.get("SEARCHLOOP_JUDGE_MODEL", "").strip()
    if not base_url or not model:
        return None
    return JudgeConfig(base_url=base_url, model=model, prompt=prompt)  # the key stays in the environment


def build_prompt(item: JudgeItem, prompt: JudgePrompt) -> str:
    """The user message for one item."""
    if prompt == "research":
        return RESEARCH_PROMPT.format(question=item.question, golds=json.dumps(item.golden_answers),
                                      prediction=item.prediction)
    golds = item.golden_answers[0] if len(item.golden_answers) == 1 else "; ".join(item.golden_answers)
    return R1SEARCHER_PROMPT.format(question=item.question, golds=golds, prediction=item.prediction)


def parse_verdict(text: str, prompt: JudgePrompt) -> bool | None:
    """Read the judge's reply: the JSON ``judgement`` (research) or the first True/False word (r1searcher)."""
    if prompt == "r1searcher":
        match = re.search(r"\b(true|false)\b", text, re.IGNORECASE)
        return None if match is None else match.group(1).lower() == "true"
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match is None:
        return None
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    judgement = str(data.get("judgement", "")).strip().lower() if isinstance(data, dict) else ""
    return {"correct": True, "incorrect": False}.get(judgement)


def verdict_from_value(value: object) -> bool | None:
    """A stored judge verdict (e.g. R1-Searcher's ``gpt4o_output`` "True"/"False", ReSearch's
    ``{"judgement": "correct"}`` or a bool) as True/False; None when unreadable."""
    if isinstance(value, bool):
        return value
    if isinstance(value, dict):
        value = value.get("judgement", "")
    text = str(value).strip()
    word = {"true": True, "correct": True, "false": False, "incorrect": False}.get(text.lower())
    if word is not None:
        return word
    return parse_verdict(text, "research") if text.startswith("{") else parse_verdict(text, "r1searcher")


def _ask(client, config: JudgeConfig, item: JudgeItem) -> JudgeVerdict:
    import httpx

    body: dict = {
        "model": config.model,
        "messages": [{"role": "user", "content": build_prompt(item, config.prompt)}],
        "temperature": config.temperature,
        "max_tokens": config.max_tokens,
    }
    if config.prompt == "research" and config.json_mode:
        body["response_format"] = {"type": "json_object"}
    error = ""
    for attempt in range(config.max_retries + 1):
        try:
            resp = client.post("/chat/completions", json=body)
            if resp.status_code == 429 or resp.status_code >= 500:
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
            elif resp.status_code >= 400:
                return JudgeVerdict(correct=None, error=f"HTTP {resp.status_code}: {resp.text[:200]}")
            else:
                text = resp.json()["choices"][0]["message"]["content"] or ""
                verdict = parse_verdict(text, config.prompt)
                return JudgeVerdict(correct=verdict, raw=text, error=None if verdict is not None else "unparseable")
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        if attempt < config.max_retries:
            time.sleep(min(0.25 * 2**attempt, 4.0))
    return JudgeVerdict(correct=None, error=error)


def judge_answers(items: Sequence[JudgeItem], config: JudgeConfig | None = None) -> JudgeResult:
    """Judge every item; skipped (with :data:`SKIP_MESSAGE`) when neither ``config`` nor the env gives an endpoint.

    Args:
        items: predictions with their questions and golds.
        config: endpoint and prompt; default from :func:`judge_config_from_env`.
    """
    import httpx

    config = config or judge_config_from_env()
    if config is None:
        log.info(SKIP_MESSAGE)
        return JudgeResult(skipped=True, message=SKIP_MESSAGE)
    key = secret_value(config.api_key, "SEARCHLOOP_JUDGE_API_KEY") or secret_value(None, "OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client = httpx.Client(base_url=config.base_url.rstrip("/"), headers=headers, timeout=config.timeout_s)
    with client, ThreadPoolExecutor(max_workers=max(1, config.concurrency)) as pool:
        verdicts = list(pool.map(lambda it: _ask(client, config, it), items))
    failed = sum(1 for v in verdicts if v.correct is None)
    message = f"judged {len(verdicts)} items with {config.model} ({config.prompt} prompt); {failed} without verdict"
    return JudgeResult(skipped=False, message=message, verdicts=verdicts)
