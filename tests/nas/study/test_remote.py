"""A pooled trial's rank 0 reaches its worker's leader over a link: decisions come back as
the leader made them, its errors as it raised them, and a worker that is gone is named."""

from __future__ import annotations

import pickle
from pathlib import Path

import optuna
import pytest

from nas.study.leader import Leader, TrialOrder
from nas.study.remote import LeaderLink, LeaderService
from nas.study.trials import Outcome
from nas.tracking import TrialEnd
from tests.nas.harness.common import tiny_settings


def test_a_link_asks_reports_and_tells_as_the_leader_itself(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path, "study.name=linked", "tracker=none")
    Path(settings.studies_dir).mkdir(parents=True)
    leader = Leader(settings, owner="test:1", progress=False)
    try:
        with LeaderService(leader) as service:
            link: LeaderLink = pickle.loads(pickle.dumps(service.link()))  # as a job gets it
            order = link.call(Leader.next_trial)
            assert isinstance(order, TrialOrder) and order.number == 0
            link.log_step(1, {"loss": 2.0})
            pruned = link.call(Leader.evaluated, 2, {"loss": 1.5, "validation_loss": 1.25})
            assert pruned is False
            with pytest.raises(KeyError, match="validation_loss"):  # as the leader raised it
                link.call(Leader.evaluated, 3, {"loss": 1.0})
            link.call(Leader.finish, 0, Outcome(TrialEnd.COMPLETE, {"steps": 2}, [1.25]))
            link.close()
            again = service.link()
            second = again.call(Leader.next_trial)  # the next job links anew
            assert second is not None and second.number == 1
            again.close()
        with pytest.raises(ConnectionError, match="the study's worker is gone"):
            again.call(Leader.next_trial)
        gone = service.link()
        gone.log_step(4, {"loss": 1.0})  # between decisions: held, not raised
        with pytest.raises(ConnectionError, match="the study's worker is gone"):
            gone.call(Leader.evaluated, 4, {"validation_loss": 1.0})
    finally:
        leader.close()
    trial = leader.study.trials[0]
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.values == [1.25]
    assert trial.intermediate_values == {2: 1.25} and trial.user_attrs["steps"] == 2
