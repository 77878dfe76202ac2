"""Failpoint specs: off by default, N-th hit, batch filter, bad specs refused."""

import pytest

from percolake import failpoints


@pytest.fixture(autouse=True)
def clean():
    failpoints.disable()
    yield
    failpoints.disable()


def test_an_inactive_point_does_nothing():
    failpoints.fail_point("after-open", 3)


def test_nth_hit_of_the_named_batch_only_raises():
    failpoints.enable("mid-prewrite", "2*raise@3")
    for batch in (0, 3, 1, 2):  # first hit of batch 3 and hits of other batches pass
        failpoints.fail_point("mid-prewrite", batch)
    failpoints.fail_point("other-point", 3)
    with pytest.raises(failpoints.FailpointError, match="mid-prewrite"):
        failpoints.fail_point("mid-prewrite", 3)
    failpoints.fail_point("mid-prewrite", 3)  # only the N-th


def test_without_a_batch_filter_every_hit_counts():
    failpoints.enable("after-commit-reply", "2*raise")
    failpoints.fail_point("after-commit-reply", 7)
    with pytest.raises(failpoints.FailpointError):
        failpoints.fail_point("after-commit-reply")


@pytest.mark.parametrize("spec", ["explode", "2*", "exit@", "sleep(x)", "raise@b1"])
def test_bad_specs_are_refused(spec):
    with pytest.raises(ValueError, match="bad failpoint action"):
        failpoints.enable("x", spec)
