"""The generation server's scheduler with a fake generator (unit level): chunked continuation, stop strings across
chunk boundaries, round-robin between requests, failures isolated to their request, cancelled jobs dropped."""

from __future__ import annotations

import asyncio

import pytest

from training.generation.base import Completion, SamplingParams, cut_at_stop
from training.generation.scheduler import GenerationFailed, GenerationScheduler


class CharGenerator:
    """Emits the characters of ``script`` one 'token' at a time, continuing from where the prompt's text left off."""

    eos_token = None
    tokenizer = None

    def __init__(self, script: str) -> None:
        self.script, self.calls = script, []

    def generate(self, prompts, sampling, max_tokens=None):
        self.calls.append(list(prompts))
        out = []
        for p, budget in zip(prompts, max_tokens, strict=True):
            if "BOOM" in p:
                raise RuntimeError("boom")
            done = len(p.split("|", 1)[1]) if "|" in p else 0
            text = self.script[done: done + budget]
            cut, stop = cut_at_stop(text, sampling.stop)
            out.append(Completion(text=cut, token_ids=[ord(c) for c in cut], finish_reason="stop" if stop else "length",
                                  stop=stop))
        return out


def _run(coro):
    return asyncio.run(coro)


async def _with(gen, fn, chunk=4, rows=8):
    s = GenerationScheduler(gen, 0.0, rows, chunk)
    await s.start()
    try:
        return await fn(s), s
    finally:
        await s.close()


def test_long_completion_continues_in_chunks_and_stops_across_a_boundary() -> None:
    gen = CharGenerator("abcdefgXYhij")
    sampling = SamplingParams(max_tokens=50, stop=["gXY"])
    (out, s) = _run(_with(gen, lambda s: s.submit(["q|"], 50, sampling)))
    assert out[0].text == "abcdefgXY" and out[0].finish_reason == "stop" and out[0].stop == "gXY"
    assert s.calls == 3  # "abcd", "efgX", "Yhij" -> cut after the stop that spans two chunks


def test_budget_is_total_and_round_robin_serves_short_requests_first() -> None:
    gen = CharGenerator("x" * 100)

    async def both(s):
        long = asyncio.ensure_future(s.submit(["L|"], 40, SamplingParams(max_tokens=40)))
        await asyncio.sleep(0)
        short = await s.submit(["S|"], 1, SamplingParams(max_tokens=1))
        assert not long.done()  # served while the long one still runs
        return await long, short

    ((long, short), s) = _run(_with(gen, both))
    assert len(long[0].text) == 40 and len(short[0].text) == 1


def test_failure_is_isolated_to_its_request() -> None:
    gen = CharGenerator("y" * 10)

    async def mix(s):
        good = [s.submit([f"g{i}|"], 3, SamplingParams(max_tokens=3)) for i in range(3)]
        bad = s.submit(["BOOM|"], 3, SamplingParams(max_tokens=3))
        return await asyncio.gather(*good, bad, return_exceptions=True)

    (res, _) = _run(_with(gen, mix))
    assert [r[0].text for r in res[:3]] == ["yyy"] * 3
    assert isinstance(res[3], GenerationFailed) and "boom" in str(res[3])


def test_cancelled_job_stops() -> None:
    gen = CharGenerator("z" * 1000)

    async def cancel(s):
        jobs = []
        task = asyncio.ensure_future(s.submit(["c|"], 1000, SamplingParams(max_tokens=1000), jobs.append))
        await asyncio.sleep(0.05)
        jobs[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        calls = s.calls
        await asyncio.sleep(0.05)
        return calls, s.calls

    ((before, after), s) = _run(_with(gen, cancel, chunk=1))
    assert after - before <= 1 and s.saturation()["requests"] == 0 and s.cancelled == 1
