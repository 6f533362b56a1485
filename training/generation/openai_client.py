"""OpenAI-compatible server generator (vLLM / SGLang ``serve``), over HTTP with httpx.

``mode="completions"`` (default) sends the rendered prompt text to ``/completions`` (the rollout engine builds
prompts with the chat template itself, so multi-turn continuation works); prompts sharing a token budget go in
one batched request. ``mode="chat"`` sends each prompt as a single user message to ``/chat/completions`` (single
turn only, e.g. judges). With a seed, each prompt goes in its own request with the seed ``derive_seed(seed, i)``
(a server applies one request's seed to every prompt in it, so K copies of a question would come back identical);
the requests run concurrently and the server batches them (the same seeds give the same samples only when the
server batches them the same way: vLLM is not batch-invariant; ``max_concurrency=1`` replays exactly). vLLM
extensions (stop string kept in the output, token ids) are requested when ``vllm_extras`` is on; ``stop_reason``
(vLLM) or ``matched_stop`` (SGLang) tells a stop string from EOS.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from infra.config import secret_value
from infra.errors import SearchloopError
from training.generation.base import Completion, SamplingParams, derive_seed, regroup

API_KEY_ENV = "SEARCHLOOP_GENERATOR_TOKEN"  # the bearer token when none is passed

log = logging.getLogger(__name__)


class GenerationServerError(SearchloopError):
    """The OpenAI-compatible server failed or answered something unusable."""


class OpenAICompatibleGenerator:
    """Client of an OpenAI-compatible server.

    Args:
        base_url: server URL including the API prefix, e.g. ``http://127.0.0.1:8000/v1``.
        model: model name the server serves.
        mode: ``completions`` or ``chat``.
        api_key: bearer token (optional; default: the SEARCHLOOP_GENERATOR_TOKEN environment variable).
        tokenizer: HF tokenizer of the served model (for chat templates and masks); optional.
        eos_token: EOS text of the model (defaults to the tokenizer's).
        timeout: seconds per request. retries: attempts on connection errors and 5xx answers.
        vllm_extras: send vLLM-only fields (``include_stop_str_in_output``, ``return_token_ids``).
        max_concurrency: requests in flight at once (seeded calls send one request per prompt).
        transport: httpx transport (tests).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        mode: Literal["completions", "chat"] = "completions",
        api_key: str | None = None,
        tokenizer: Any | None = None,
        eos_token: str | None = None,
        timeout: float = 300.0,
        retries: int = 3,
        vllm_extras: bool = True,
        max_concurrency: int = 64,
        transport: Any | None = None,
    ) -> None:
        import httpx

        self.base_url, self.model, self.mode = base_url.rstrip("/"), model, mode
        self.tokenizer = tokenizer
        self.eos_token = eos_token or (tokenizer.eos_token if tokenizer is not None else None)
        eos_id = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        self._eos_ids = {eos_id} if isinstance(eos_id, int) else set(eos_id or ())
        self.retries, self.vllm_extras, self.max_concurrency = retries, vllm_extras, max(1, max_concurrency)
        api_key = secret_value(api_key, API_KEY_ENV)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers, transport=transport)

    @classmethod
    def from_model(
        cls, model: str, base_url: str = "http://127.0.0.1:8000/v1", **kwargs: Any
    ) -> OpenAICompatibleGenerator:
        """Client for ``model`` served at ``base_url``."""
        return cls(base_url=base_url, model=model, **kwargs)

    def health(self) -> bool:
        """True when ``GET /models`` answers 200."""
        try:
            return self.client.get(f"{self.base_url}/models").status_code == 200
        except Exception:  # noqa: BLE001 - any transport failure means "not healthy"
            return False

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        url = f"{self.base_url}{path}"
        for attempt in range(1, self.retries + 1):
            try:
                r = self.client.post(url, json=body)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise GenerationServerError(f"cannot reach {url}: {exc}; is the server running?") from exc
                time.sleep(0.5 * attempt)
                continue
            if r.status_code >= 500 and attempt < self.retries:
                time.sleep(0.5 * attempt)
                continue
            if r.status_code != 200:
                raise GenerationServerError(f"{url} answered {r.status_code}: {r.text[:300]}")
            return r.json()
        raise GenerationServerError(f"{url}: no answer after {self.retries} attempts")

    def _body(self, sampling: SamplingParams, max_tokens: int, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "n": sampling.candidates,
        }
        if seed is not None:
            body["seed"] = seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.wants_logprobs:
            body["logprobs"] = 1 if self.mode == "completions" else True
        if self.vllm_extras:
            body.update(include_stop_str_in_output=True, return_token_ids=True, skip_special_tokens=True)
        return body

    def _completion(self, choice: dict[str, Any], stops: list[str]) -> Completion:
        text = choice.get("text") if self.mode == "completions" else (choice.get("message") or {}).get("content")
        text = text or ""
        stop = choice.get("stop_reason", choice.get("matched_stop"))
        stop = stop if isinstance(stop, str) and stop in stops else None
        if stop is not None and not text.endswith(stop):
            text += stop
        reason = "length" if choice.get("finish_reason") == "length" else ("stop" if stop else "eos")
        lp = choice.get("logprobs") or {}
        token_lps = lp.get("token_logprobs") if self.mode == "completions" else [
            c.get("logprob") for c in (lp.get("content") or [])
        ]
        ids = choice.get("token_ids") or [-1] * len(token_lps or [])
        # EOS included, as offline; an empty list (EOS first: no token kept) sums to 0, not "no log-probs"
        cum = float(sum(x for x in token_lps if x is not None)) if token_lps is not None else None
        if reason == "eos" and ids and ids[-1] in self._eos_ids:
            # vLLM returns the EOS id it stopped on; every backend's ids end before EOS (the offline engines, ours)
            ids = ids[:-1]
            token_lps = token_lps[:-1] if token_lps and len(token_lps) > len(ids) else token_lps
        per_token = [float(x) for x in token_lps] if token_lps is not None and None not in token_lps else None
        return Completion(text=text, token_ids=list(ids), finish_reason=reason, stop=stop, cumulative_logprob=cum,
                          token_logprobs=per_token)

    def _run_group(self, prompts: list[str], sampling: SamplingParams, budget: int,
                   seed: int | None) -> list[Completion]:
        body = self._body(sampling, budget, seed)
        if self.mode == "completions":
            data = self._post("/completions", {**body, "prompt": prompts})
            choices = sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        else:
            choices = []
            for p in prompts:
                data = self._post("/chat/completions", {**body, "messages": [{"role": "user", "content": p}]})
                choices += sorted(data.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts) * sampling.candidates:
            raise GenerationServerError(
                f"server returned {len(choices)} choices for {len(prompts)} prompts x n={sampling.candidates}"
            )
        return [self._completion(c, list(sampling.stop)) for c in choices]

    def generate(
        self, prompts: list[str], sampling: SamplingParams, max_tokens: list[int] | None = None
    ) -> list[Completion]:
        """Generate ``sampling.n`` completions per prompt (prompt-major): one request per distinct budget, or per
        prompt when seeded (see the module docstring)."""
        if not prompts:
            return []
        budgets = sampling.budgets(max_tokens, len(prompts))
        groups: dict[tuple[int, int | None], list[int]] = {}
        for i, b in enumerate(budgets):
            key = (b, None) if sampling.seed is None else (b, derive_seed(sampling.seed, i))
            groups.setdefault(key, []).append(i)
        k = sampling.candidates
        flat: list[Completion | None] = [None] * (len(prompts) * k)
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(groups))) as pool:
            futures = {key: pool.submit(self._run_group, [prompts[i] for i in idx], sampling, *key)
                       for key, idx in groups.items()}
            for key, idx in groups.items():
                comps = futures[key].result()
                for j, i in enumerate(idx):
                    flat[i * k : (i + 1) * k] = comps[j * k : (j + 1) * k]
        return regroup([c for c in flat if c is not None], len(prompts), sampling)
