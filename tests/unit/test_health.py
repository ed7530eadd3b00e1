"""The health checks' verdicts on a run's figures (:mod:`difftest.execution.health`)."""

from __future__ import annotations

from difftest.execution.health import HealthCheck, PathUse, check_health


def _idle(name: str = "p") -> PathUse:
    return PathUse(name=name, ran=0, skipped=0, skip_reasons={})


def test_no_case_ran_names_the_budget_when_it_ended_the_run_before_any_case() -> None:
    (issue,) = check_health(
        [_idle()], cases=0, wall_s=20.0, budget_s=20.0, budget_spent=True, compile_wait_s=11.5
    )
    assert issue.check is HealthCheck.NO_CASE_RAN and issue.severity == "error"
    assert "the 20s budget was spent before the first case ended" in issue.message
    assert "11.5s of it waiting on kernel module builds" in issue.message
    assert "difftest warmup" in issue.message
    (quiet,) = check_health([_idle()], cases=0, wall_s=2.0, budget_s=2.0, budget_spent=True)
    assert "raise --budget-s" in quiet.message and "module" not in quiet.message


def test_no_case_ran_keeps_its_other_reasons_when_the_budget_did_not_end_the_run() -> None:
    unsupported = PathUse(name="p", ran=0, skipped=5, skip_reasons={"needs sinks": 5})
    (issue,) = check_health([unsupported], cases=5, wall_s=1.0, budget_s=20.0, budget_spent=True)
    assert "every case was unsupported" in issue.message and "needs sinks" in issue.message
    (issue,) = check_health([_idle()], cases=0, wall_s=1.0, budget_s=20.0)
    assert "no case could be run" in issue.message and "budget" not in issue.message
    assert check_health([_idle()], cases=0, wall_s=1.0, suppress=["no_case_ran"]) == []


def test_a_run_that_ran_a_case_has_no_such_issue() -> None:
    ran = PathUse(name="p", ran=3, skipped=0, skip_reasons={})
    assert check_health([ran], cases=3, wall_s=20.0, budget_s=20.0, budget_spent=True) == []
