"""The restart policy's decisions, the stop intents, and Slurm's job line, as pure logic.

The same rules run for real in ``tests/integration/test_faults.py`` (lost node, SIGTERM
preemption, time limits, a broken checkpoint) on the Slurm test cluster.
"""

from __future__ import annotations

import time

import pytest

from podium.config.launcher import RestartSettings
from podium.config.spec import TeacherSpec
from podium.launcher.backends.base import NodeContext, StopIntent
from podium.launcher.backends.slurm import environment as slurm_environment
from podium.launcher.common.restarts import RestartLedger, decide, excluded_after
from podium.launcher.common.slurm_state import parse_scontrol_job, slurm_time
from podium.launcher.job.signals import Signals

# `scontrol show job -o` of a job preempted by SIGTERM with GraceTime=20 (Slurm 22.05, this test cluster).
PREEMPTED = ("JobId=51 JobName=probe2.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 Nice=0 "
             "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
             "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:47 TimeLimit=00:10:00 TimeMin=N/A "
             "SubmitTime=2026-12-01T20:04:35 EligibleTime=2026-12-01T20:04:35 StartTime=2026-12-01T20:04:35 "
             "EndTime=2026-12-01T20:05:42 Deadline=N/A PreemptEligibleTime=2026-12-01T20:04:35 "
             "PreemptTime=2026-12-01T20:05:22 SuspendTime=None TRES=cpu=4,node=2,billing=4 "
             "Comment=podium:abc:def Command=/tmp/exp/probe 2.sh")
SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)


def test_failures_back_off_then_give_up_and_serving_resets_the_count() -> None:
    settings = RestartSettings(max_consecutive_failures=3, backoff_s=10, max_backoff_s=25)
    ledger = RestartLedger()
    delays = []
    for n in (1, 2):
        ledger = ledger.ended(f"7:{n}", "failed", "boom")
        decision = decide(ledger, "failed", settings, can_requeue=True)
        assert decision.requeue and not decision.final
        delays.append(decision.delay_s)
    assert delays == [10, 20]
    ledger = ledger.ended("7:3", "failed", "boom")
    final = decide(ledger, "failed", settings, can_requeue=True)
    assert not final.requeue and final.final and "3 consecutive failed generations" in final.why
    served = ledger.ready().ended("7:4", "failed", "boom")
    assert served.consecutive_failures == 1  # a generation that served reset the count
    assert decide(served, "failed", settings, can_requeue=True).delay_s == 10


def test_preemptions_and_time_limits_requeue_at_once_up_to_max_requeues() -> None:
    ledger = RestartLedger()
    for outcome in ("preempted", "time_limit"):
        ledger = ledger.ended("1:0", outcome, "x")
        # a time limit requeues when the recipe asks (restart.at_time_limit: requeue; default: stop)
        decision = decide(ledger, outcome, RestartSettings(at_time_limit="requeue"), can_requeue=True)
        assert decision.requeue and decision.delay_s == 0 and ledger.consecutive_failures == 0
    capped = decide(ledger, "preempted", RestartSettings(max_requeues=1), can_requeue=True)
    assert capped.final and not capped.requeue and "restart.max_requeues=1" in capped.why
    assert not decide(ledger, "stopped", RestartSettings(), can_requeue=True).requeue
    local = decide(ledger.ended("1:1", "failed", "x"), "failed", RestartSettings(), can_requeue=False)
    assert local.final and not local.requeue


def test_lost_nodes_are_excluded_once_and_only_when_asked() -> None:
    ledger = excluded_after(RestartLedger(), "n2", RestartSettings())
    assert excluded_after(ledger, "n2", RestartSettings()).excluded_nodes == ("n2",)
    assert excluded_after(RestartLedger(), "n2", RestartSettings(exclude_lost_nodes=False)).excluded_nodes == ()


def test_scontrol_job_line() -> None:
    job = parse_scontrol_job(PREEMPTED)
    assert (job["JobState"], job["Restarts"], job["TRES"]) == ("RUNNING", "0", "cpu=4,node=2,billing=4")
    assert job["Command"] == "/tmp/exp/probe 2.sh" and job["Comment"] == "podium:abc:def"
    assert slurm_time(job["EndTime"]) - slurm_time(job["PreemptTime"]) == 20.0  # GraceTime
    assert slurm_time(job["SuspendTime"]) is None and parse_scontrol_job("") == {}


def test_a_stop_is_classified_once_and_urgency_follows_its_kind() -> None:
    asked: list[str] = []

    def classify(name: str) -> StopIntent:
        asked.append(name)
        return StopIntent("preempt", True, time.time() + 5, "preempted")

    signals = Signals()
    signals.set_classifier(classify, drain_s=10)
    assert signals.intent() is None  # no stop yet
    signals._handler(15, None)
    signals._handler(15, None)
    assert signals.requeue and signals.intent().kind == "preempt" and asked == ["SIGTERM"]
    assert not signals.urgent.is_set() and 0 < signals.intent().drain_s() <= 5
    assert signals.describe() == "preempted (SIGTERM); requeueing"

    failing = Signals()
    failing.set_classifier(lambda name: (_ for _ in ()).throw(OSError("scontrol: not found")), drain_s=10)
    failing._handler(15, None)
    assert failing.intent().kind == "cancel" and failing.urgent.is_set()  # the safe reading
    assert "not classified (OSError: scontrol: not found)" in failing.describe()

    fault = Signals()
    fault.request_stop("node n2 lost", kind="fault", requeue=True)
    assert fault.urgent.is_set() and fault.requeue and fault.intent().drain_s() == 0


@pytest.mark.parametrize(("name", "kind"), [("SIGUSR2", "signal"), ("SIGTERM", "cancel")])
def test_without_a_classifier_a_user_signal_drains_and_a_term_cancels(name: str, kind: str) -> None:
    import signal as sig

    signals = Signals()
    signals._handler(getattr(sig, name), None)
    assert signals.intent().kind == kind and signals.urgent.is_set() == (kind == "cancel")


def test_watched_nodes_match_ray_to_the_node_tasks() -> None:
    from podium.launcher.common.node_files import NodeState
    from podium.launcher.job.watchdog import watched_nodes

    alive = [{"NodeID": "a", "NodeManagerAddress": "127.0.0.11"}, {"NodeID": "b", "NodeManagerAddress": "127.0.0.12"}]
    recorded = [NodeState(state="started", rank=0, host="n1", ip="127.0.0.11"),
                NodeState(state="started", rank=1, host="n2", ip="127.0.0.12")]
    nodes = watched_nodes(alive, recorded, "n1")
    assert [(n.node_id, n.rank, n.host) for n in nodes] == [("a", 0, "n1"), ("b", 1, "n2")]
    assert nodes[1].describe() == "node n2 (rank 1, 127.0.0.12)"
    # cluster: local: the task recorded 127.0.0.1, Ray advertises the host's address instead
    (local,) = watched_nodes([{"NodeID": "c", "NodeManagerAddress": "192.0.2.2"}],
                             [NodeState(state="started", rank=0, host="vm", ip="127.0.0.1")], "vm")
    assert (local.node_id, local.rank, local.host, local.ip) == ("c", 0, "vm", "192.0.2.2")
    (unknown, _) = watched_nodes(alive, [], "n1")
    assert unknown.rank is None and unknown.describe() == "node 127.0.0.11 (127.0.0.11)"



def _time_limit_intent(monkeypatch: pytest.MonkeyPatch, spec: TeacherSpec, signal_name: str):
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 100))
    monkeypatch.setattr(slurm_environment, "show_job", lambda job_id: {
        "JobState": "RUNNING", "Restarts": "0", "PreemptTime": "None", "EndTime": end})
    ctx = NodeContext(job_id="9", rank=0, num_nodes=1, restart=0, host="n1")
    return slurm_environment.SlurmEnvironment().stop_intent(ctx, signal_name, spec)


@pytest.mark.parametrize("signal_name", ["SIGUSR2", "SIGTERM"])
def test_a_time_limit_stops_by_default_and_requeues_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                                signal_name: str) -> None:
    """A time limit ends a teacher unless the recipe asks for a requeue."""
    intent = _time_limit_intent(monkeypatch, SPEC, signal_name)
    assert intent.kind == "time_limit" and not intent.requeue
    ledger = RestartLedger().ended("9:0", "time_limit", intent.why)
    decision = decide(ledger, "time_limit", SPEC.launcher.restart, can_requeue=True)
    assert not decision.requeue and not decision.final and "at_time_limit" in decision.why
    asked = SPEC.model_copy(update={"launcher": SPEC.launcher.model_copy(update={
        "restart": SPEC.launcher.restart.model_copy(update={"at_time_limit": "requeue"})})})
    intent = _time_limit_intent(monkeypatch, asked, signal_name)
    assert intent.kind == "time_limit" and intent.requeue
    assert decide(ledger, "time_limit", asked.launcher.restart, can_requeue=True).requeue
    assert decide(RestartLedger().ended("9:0", "preempted", "p"), "preempted", SPEC.launcher.restart,
                  can_requeue=True).requeue  # preemption still requeues
