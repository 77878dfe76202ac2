import itertools

import pytest

from percolake.states import (
    VALID_PREVIOUS,
    IllegalTransition,
    TxnState,
    can_transition,
    check_transition,
)

S = TxnState
VALID = {
    (S.OPEN, S.PREWRITTEN), (S.PREWRITTEN, S.PREWRITTEN),
    (S.OPEN, S.COMMITTED), (S.PREWRITTEN, S.COMMITTED),
    (S.COMMITTED, S.APPLIED),
    # a commit with no table to apply (empty batch) is APPLIED in its one durable write
    (S.OPEN, S.APPLIED), (S.PREWRITTEN, S.APPLIED),
    (S.OPEN, S.ABORTED), (S.PREWRITTEN, S.ABORTED),
}


@pytest.mark.parametrize("current,target", sorted(VALID, key=str))
def test_valid_transition_is_allowed(current, target):
    assert can_transition(current, target)
    check_transition(current, target)


@pytest.mark.parametrize(
    "current,target",
    sorted(set(itertools.product(S, S)) - VALID, key=str),
)
def test_invalid_transition_is_refused_loudly(current, target):
    assert not can_transition(current, target)
    with pytest.raises(IllegalTransition):
        check_transition(current, target)


def test_committed_and_aborted_are_decisions_that_never_cross():
    assert S.COMMITTED not in VALID_PREVIOUS[S.ABORTED]
    assert S.ABORTED not in VALID_PREVIOUS[S.COMMITTED]
    assert S.APPLIED not in VALID_PREVIOUS[S.ABORTED]


def test_states_hash_by_identity_and_survive_a_pickle_round_trip():
    """States are dict keys and set members everywhere (hashed in C, by identity): a state
    read back from a pickle is the same member, found in the same sets."""
    import pickle

    assert all(hash(state) == object.__hash__(state) for state in S)
    assert {S.OPEN: 1}[pickle.loads(pickle.dumps(S.OPEN))] == 1
    assert pickle.loads(pickle.dumps(S.COMMITTED)) in VALID_PREVIOUS[S.APPLIED]
    assert len({*S, *S}) == len(S) == 5
    assert S("APPLIED") is S.APPLIED
