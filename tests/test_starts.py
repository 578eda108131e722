"""starts.py: a batch's rows start their device work in one call."""

import mlx.core as mx

from mlx_dflash import starts


def test_together_collects_the_starts_into_one_call(monkeypatch):
    calls = []
    monkeypatch.setattr(starts.mx, "async_eval", lambda arrays: calls.append(list(arrays)))
    a, b, c = mx.array(1), mx.array(2), mx.array(3)
    starts.start_eval([a])
    assert len(calls) == 1  # outside: at once
    with starts.together():
        starts.start_eval([b])
        with starts.together():  # an inner one hands its starts to the outer
            starts.start_eval([c])
        assert len(calls) == 1
    assert len(calls) == 2 and calls[1] == [b, c]
    with starts.together():
        pass
    assert len(calls) == 2  # nothing started, no call


def test_an_error_inside_starts_nothing_and_leaves_starts_immediate(monkeypatch):
    calls = []
    monkeypatch.setattr(starts.mx, "async_eval", lambda arrays: calls.append(list(arrays)))
    try:
        with starts.together():
            starts.start_eval([mx.array(1)])
            raise KeyError("row")
    except KeyError:
        pass
    assert calls == []
    starts.start_eval([mx.array(2)])
    assert len(calls) == 1
