"""On a pipe a running trial writes one progress line at most every 30 s, driven here by an
injected clock: none for a trial shorter than that, none at its last step (its end line
follows), each a whole line with no carriage return."""

import io

from sweeper.results.display import PIPE_INTERVAL_S, TrialLine


def test_a_trial_on_a_pipe_says_where_it_is_every_30_s_at_most():
    assert PIPE_INTERVAL_S == 30.0
    now = [1000.0]
    pipe = io.StringIO()
    line = TrialLine("[sweep s] t1 lr=0.002", 100, stream=pipe, clock=lambda: now[0])
    line.step(0, {"eval/reward/mean": 0.3})  # the baseline: the clock starts here
    written = []
    for step in range(1, 101):  # a step every 1.5 s: 150 s of training
        now[0] += 1.5
        line.step(step, {"reward/mean": 0.25})
        if pipe.getvalue().count("\n") > len(written):
            written.append((step, now[0]))
    assert [step for step, _ in written] == [20, 40, 60, 80]  # every 30 s, not at step 100
    assert pipe.getvalue().splitlines()[0] == (
        "[sweep s] t1 lr=0.002 step 20/100, 0.67 step/s, ETA 120 s, reward 0.25"
    )
    assert "\r" not in pipe.getvalue()


def test_a_trial_shorter_than_the_interval_writes_nothing_on_a_pipe():
    now = [0.0]
    pipe = io.StringIO()
    line = TrialLine("[sweep s] t1", 10, stream=pipe, clock=lambda: now[0])
    for step in range(11):
        now[0] += 2.0
        line.step(step, {})
    assert pipe.getvalue() == ""
