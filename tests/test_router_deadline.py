"""Which client connections the router's header deadline closes (pure part)."""

from __future__ import annotations

from disagg.router.deadline import HeaderDeadline


class FakeConnection:
    closed = False

    def force_close(self) -> None:
        self.closed = True


def test_a_connection_without_a_first_request_is_late_after_the_deadline() -> None:
    deadline = HeaderDeadline(timeout=10)
    slow, served = FakeConnection(), FakeConnection()
    deadline.saw_request(served)
    assert deadline.overdue([slow, served], now=100.0) == []
    assert deadline.overdue([slow, served], now=109.0) == []
    assert deadline.overdue([slow, served], now=110.5) == [slow]
