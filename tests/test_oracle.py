from coordinator.oracle import LOGICAL_BITS, TimestampOracle
from coordinator.store import MemoryStore, SqliteStore


class SteppingClock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def test_timestamps_strictly_increase_within_one_millisecond():
    oracle = TimestampOracle(MemoryStore(), wall_ms=SteppingClock(1_000))
    stamps = [oracle.next() for _ in range(10_000)]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))


def test_timestamps_increase_when_the_wall_clock_steps_back():
    clock = SteppingClock(5_000_000)
    oracle = TimestampOracle(MemoryStore(), wall_ms=clock)
    before = oracle.next()
    clock.ms -= 3_600_000  # an hour backwards
    after = [oracle.next() for _ in range(100)]
    assert before < after[0] and after == sorted(set(after))


def test_timestamps_increase_across_a_restart_with_the_clock_stepped_back(tmp_path):
    clock = SteppingClock(9_000_000)
    store = SqliteStore(tmp_path)
    first = TimestampOracle(store, wall_ms=clock)
    handed_out = [first.next() for _ in range(1000)]
    store.close()  # "crash": nothing but the store survives
    clock.ms -= 60_000
    second = TimestampOracle(SqliteStore(tmp_path), wall_ms=clock)
    assert second.next() > max(handed_out)


def test_high_water_mark_is_persisted_ahead_of_every_handed_out_timestamp(tmp_path):
    store = SqliteStore(tmp_path)
    clock = SteppingClock(1_000)
    oracle = TimestampOracle(store, wall_ms=clock, window_ms=10)
    for step in range(200):
        clock.ms += step % 3
        ts = oracle.next()
        assert store.read_timestamp_high_water() > ts


def test_timestamp_carries_its_wall_time():
    oracle = TimestampOracle(MemoryStore(), wall_ms=SteppingClock(123_456))
    assert oracle.next() >> LOGICAL_BITS == 123_456
