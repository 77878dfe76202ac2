import threading
import time

from coordinator.oracle import LOGICAL_BITS, TimestampOracle
from coordinator.store import MemoryStore, SqliteStore
from percolake.errors import NotLeader


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


class HeldMarkStore(MemoryStore):
    """A store whose high-water writes from the background extension wait until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writers: list[str] = []
        self.fail_extensions = False

    def write_timestamp_high_water(self, value: int) -> None:
        name = threading.current_thread().name
        self.writers.append(name)
        if name == "oracle-extend":
            assert self.release.wait(10)
            if self.fail_extensions:
                raise NotLeader("another coordinator took over")
        super().write_timestamp_high_water(value)


def test_the_mark_is_extended_in_the_background_before_the_callers_reach_it():
    store = HeldMarkStore()
    clock = SteppingClock(1_000)
    oracle = TimestampOracle(store, wall_ms=clock, window_ms=100)
    first = oracle.next()  # no mark yet: written by the caller
    assert store.writers == ["MainThread"]
    clock.ms += 60  # past half the window: an extension starts, the caller does not wait
    started = time.monotonic()
    stamps = [oracle.next() for _ in range(100)]
    assert time.monotonic() - started < 1.0
    assert store.writers == ["MainThread", "oracle-extend"]
    assert max(stamps) < store.read_timestamp_high_water() == oracle.high_water
    store.release.set()
    oracle.close()  # waits for the extension
    assert oracle.high_water == store.read_timestamp_high_water() > first + (100 << LOGICAL_BITS)
    clock.ms += 60  # inside the extended mark: nothing written by the caller
    oracle.next()
    assert store.writers.count("MainThread") == 1


def test_a_failed_extension_leaves_the_caller_to_write_the_mark_before_using_it():
    store = HeldMarkStore()
    store.fail_extensions = True
    store.release.set()
    clock = SteppingClock(1_000)
    oracle = TimestampOracle(store, wall_ms=clock, window_ms=100)
    for _ in range(50):
        clock.ms += 7
        ts = oracle.next()
        assert ts < store.read_timestamp_high_water()  # never handed out above the durable mark
    oracle.close()
    assert "oracle-extend" in store.writers and store.writers.count("MainThread") > 1


def test_marks_written_out_of_order_keep_the_highest(tmp_path):
    store = SqliteStore(tmp_path, group_commit=True)
    store.write_timestamp_high_water(500)
    store.write_timestamp_high_water(300)  # a slower, older extension finishing last
    assert store.read_timestamp_high_water() == 500
    store.close()
    assert SqliteStore(tmp_path).read_timestamp_high_water() == 500
