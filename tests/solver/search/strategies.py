"""Random one-batch requests for the search tests (hypothesis)."""

from __future__ import annotations

from hypothesis import strategies as st

from skrull.solver.types import Request
from tests.conftest import make_request


@st.composite
def one_batch_requests(draw: st.DrawFn, max_size: int = 30) -> Request:
    dp = draw(st.integers(1, 3))
    cp = draw(st.sampled_from([1, 2, 4]))
    bucket = draw(st.integers(10, 200))
    batch = draw(st.lists(st.integers(1, cp * bucket), min_size=1, max_size=max_size))
    return make_request([batch], dp=dp, cp=cp, bucket=bucket, time_budget_s=1.0)
