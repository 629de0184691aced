"""The emulator's flow control (sim/apiserver/flowcontrol.py): seats, per-user shares, Retry-After."""

from __future__ import annotations

from sim.apiserver.flowcontrol import MAX_RETRY_AFTER, FlowControl, FlowControlConfig, RetryAfter, seats


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_seats_follow_the_list_work_estimator():
    assert seats("get", 0) == 1
    assert seats("list", 0) == 1
    assert seats("list", 250) == 3  # one seat per 100 stored objects
    assert seats("list", 100_000) == 10  # at most MaximumSeatsLimit
    assert seats("watch", 100_000) == 1  # a watch without initial events
    assert seats("watch", 100_000, send_initial_events=True) == 10
    assert seats("create", 100_000) == 1


def test_off_by_default_admits_everything():
    control = FlowControl()
    assert all(control.admit("someone", (), 10) is None for _ in range(1000))


def test_a_user_over_its_share_is_rejected_and_others_are_not():
    clock = Clock()
    control = FlowControl(FlowControlConfig(seats_per_second=40, user_share=0.5), clock=clock)
    # 20 seats a second for each user, a bucket of one second's worth.
    assert all(control.admit("greedy", (), 1) is None for _ in range(20))
    assert control.admit("greedy", (), 1) == 1  # Retry-After: 1 s
    assert control.admit("polite", (), 1) is None  # its own share
    clock.now += 0.5  # half a second refills half the share
    assert all(control.admit("greedy", (), 1) is None for _ in range(10))
    assert control.admit("greedy", (), 1) is not None


def test_costly_lists_spend_the_share_faster():
    clock = Clock()
    control = FlowControl(FlowControlConfig(seats_per_second=40, user_share=0.5), clock=clock)
    assert control.admit("lister", (), 10) is None
    assert control.admit("lister", (), 10) is None
    assert control.admit("lister", (), 10) is not None


def test_system_masters_are_exempt():
    control = FlowControl(FlowControlConfig(seats_per_second=1, user_share=0.1), clock=Clock())
    assert all(control.admit("kubernetes-admin", ("system:masters",), 10) is None for _ in range(100))


def test_a_new_config_starts_the_buckets_again():
    clock = Clock()
    control = FlowControl(FlowControlConfig(seats_per_second=2, user_share=0.5), clock=clock)
    while control.admit("u", (), 1) is None:
        pass
    control.config = FlowControlConfig(seats_per_second=2, user_share=0.5)
    assert control.admit("u", (), 1) is None


def test_retry_after_doubles_under_sustained_rejection_and_comes_back_down():
    clock = Clock()
    retry = RetryAfter(clock=clock)
    values = []
    for _ in range(40):  # ten rejections a second for 40 s
        for _ in range(10):
            value = retry.rejected()
        values.append(value)
        clock.now += 1
    assert values[0] == 1
    assert max(values) == MAX_RETRY_AFTER
    assert values == sorted(values)  # it only grew while rejections went on
    quiet = []
    for _ in range(40):  # one rejection every 3 s: fewer than its value, it comes down
        clock.now += 3
        quiet.append(retry.rejected())
    assert quiet[-1] < MAX_RETRY_AFTER
    assert quiet[-1] == 1
