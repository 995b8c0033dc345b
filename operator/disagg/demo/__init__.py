"""`disagg demo`: the whole system on one machine, and the closed loop it shares with the tests."""
