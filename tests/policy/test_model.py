"""The reference model's fair order, on hand-checked cases (no server: the model alone).

``tests/store/test_model_vs_lua.py`` proves the Lua makes the same decisions.
"""

from __future__ import annotations

from fairlane.policy.reference.model import QueueModel


def _flood(model: QueueModel, jobs: int, running: int) -> list[str]:
    for n in range(jobs):
        model.enqueue(f"f{n:04d}", "flood", "a", 0, 1, now=0)
    return [g.id for g in model.fetch("w", ["a"], running, 60_000, now=0).jobs]


def test_a_newcomer_starts_level_with_the_work_others_have_finished() -> None:
    """A quiet tenant arriving behind a flood is not made to wait for work merely
    dispatched first: its jobs take the next slots until it has caught up with the
    flood's finished work (the noisy-neighbor case)."""
    model = QueueModel()
    running = _flood(model, 200, 20)
    for n in range(20):
        model.enqueue(f"q{n:02d}", "quiet", "a", 0, 1, now=1)
    order = []
    for slot in range(30):  # slots free one at a time; each is refilled at once
        done = running.pop(0)
        assert model.ack(done, model.jobs[done].token or 0, "ok", now=2 + slot)
        (grant,) = model.fetch("w", ["a"], 1, 60_000, now=2 + slot).jobs
        running.append(grant.id)
        order.append(grant.id[0])
    assert order[:20] == ["q"] * 20
    assert order[20:] == ["f"] * 10


def test_a_returning_tenant_gets_no_credit_for_its_idle_time() -> None:
    """Credit is bounded by the work in flight, never by how long a tenant was idle."""
    model = QueueModel()
    model.enqueue("b0", "back", "a", 0, 1, now=0)
    (first,) = model.fetch("w", ["a"], 1, 60_000, now=0).jobs
    assert model.ack(first.id, first.token, "ok", now=1)
    running = _flood(model, 500, 4)  # 'back' is idle while the flood runs a long time
    for step in range(300):
        done = running.pop(0)
        assert model.ack(done, model.jobs[done].token or 0, "ok", now=10 + step)
        running += [g.id for g in model.fetch("w", ["a"], 1, 60_000, now=10 + step).jobs]
    for n in range(50):
        model.enqueue(f"r{n:02d}", "back", "a", 0, 1, now=400)
    order = []
    for step in range(20):
        done = running.pop(0)
        assert model.ack(done, model.jobs[done].token or 0, "ok", now=500 + step)
        (grant,) = model.fetch("w", ["a"], 1, 60_000, now=500 + step).jobs
        running.append(grant.id)
        order.append(grant.id[0])
    # a head start of at most the flood's 4 jobs in flight, plus its own first job and the
    # tie (equal tags go to the smaller name), then strict alternation
    head = order.index("f")
    assert head <= 4 + 2, order
    rest = order[head:]
    assert abs(rest.count("r") - rest.count("f")) <= 1, order
