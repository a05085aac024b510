"""Per-key rpm and tpm over a sliding minute, on a fake clock."""

from __future__ import annotations

from llmgw.router import ratelimit
from llmgw.router.auth import ANONYMOUS, KeyInfo


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_unlimited_key_is_never_counted() -> None:
    """A key without limits (and the anonymous caller) is always admitted."""
    rl = ratelimit.RateLimiter(clock=Clock())
    for _ in range(1000):
        assert rl.admit(ANONYMOUS) is None
        assert rl.admit(KeyInfo(id="k")) is None


def test_rpm_refuses_with_retry_after_until_the_oldest_leaves() -> None:
    """The rpm+1th request in a minute is 429; Retry-After is when the oldest request leaves the window."""
    clock = Clock()
    rl, key = ratelimit.RateLimiter(clock=clock), KeyInfo(id="k", rpm=3)
    for dt in (0, 10, 20):
        clock.now = 1000.0 + dt
        assert rl.admit(key) is None
    clock.now = 1030.0
    refused = rl.admit(key)
    assert refused is not None and refused.status == 429 and refused.retry_after_s == 30
    assert (b"retry-after", b"30") in refused.headers()
    assert rl.spent("k") == (3, 0)  # a refusal is not counted
    clock.now = 1060.0  # the first request has left the window
    assert rl.admit(key) is None
    assert rl.admit(key) is not None


def test_retry_after_is_at_least_one_second() -> None:
    """Retry-After is never 0, which would invite an instant retry into the same refusal."""
    clock = Clock()
    rl, key = ratelimit.RateLimiter(clock=clock), KeyInfo(id="k", rpm=1)
    assert rl.admit(key) is None
    clock.now += 59.9
    refused = rl.admit(key)
    assert refused is not None and refused.retry_after_s == 1


def test_tpm_refuses_once_spent_and_reopens_as_tokens_age_out() -> None:
    """Tokens recorded after requests count; once the minute's budget is spent, 429 until enough age out."""
    clock = Clock()
    rl, key = ratelimit.RateLimiter(clock=clock), KeyInfo(id="k", tpm=100)
    assert rl.admit(key) is None
    rl.record_tokens("k", 60)
    clock.now += 15
    assert rl.admit(key) is None  # 60 < 100: still room
    rl.record_tokens("k", 70)  # the request that crosses the line is let through
    clock.now += 5
    refused = rl.admit(key)
    assert refused is not None and refused.retry_after_s == 40  # the 60 leave at +60; 70 < 100 then
    assert "130 tokens" in refused.message
    clock.now = 1060.0
    assert rl.admit(key) is None
    assert rl.spent("k") == (0, 70)


def test_keys_are_counted_apart_and_forgotten() -> None:
    """One key's use does not count against another's; `forget` drops deleted keys' windows."""
    clock = Clock()
    rl = ratelimit.RateLimiter(clock=clock)
    a, b = KeyInfo(id="a", rpm=1), KeyInfo(id="b", rpm=1)
    assert rl.admit(a) is None and rl.admit(b) is None
    assert rl.admit(a) is not None
    rl.forget(["b"])
    assert rl.admit(a) is None and rl.admit(b) is not None


def test_usage_is_read_from_answers_and_split_streams() -> None:
    """Tokens come from `usage` of a whole answer, or of the SSE event carrying it, even split across reads."""
    assert ratelimit.usage_tokens({"usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}) == 8
    assert ratelimit.usage_tokens({"usage": {"prompt_tokens": 3, "completion_tokens": 5}}) == 8
    assert ratelimit.usage_tokens({"usage": None}) == 0 and ratelimit.usage_tokens([]) == 0
    stream = (b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}\n\n'
              b"data: [DONE]\n\n")
    for cut in (1, 30, 60, 90, len(stream) - 3):
        su = ratelimit.StreamUsage()
        su.feed(stream[:cut])
        su.feed(stream[cut:])
        assert su.close() == 6
    su = ratelimit.StreamUsage()
    su.feed(b'data: {"choices":[]}\n\ndata: [DONE]')
    assert su.close() == 0
