"""Both commit paths of the store: on the event loop (NORMAL) and on a writer thread (FULL).

Jobs queued together share a transaction, yet a failing job undoes only itself, and
whatever a job's future reported as committed is in the database after a reopen.
"""

import asyncio
import sqlite3

import pytest

from astraflow.dataflow.store import Store


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_a_failing_job_undoes_only_itself_and_acknowledged_jobs_persist(tmp_path, synchronous):
    store = Store(tmp_path, synchronous)
    assert store.inline == (synchronous == "NORMAL")

    def insert(name: str, value: int):
        def job(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO counters(name, value) VALUES (?, ?)", (name, value))
            if value < 0:
                raise ValueError(f"{name} refused")
            return value
        return job

    async def main() -> list:
        store.start()
        jobs = [store.run(insert(f"c{i}", -1 if i == 3 else i)) for i in range(8)]
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
        # one at a time too: a job alone in its transaction
        for name, value in (("alone-bad", -1), ("alone-good", 9)):
            try:
                outcomes.append(await store.run(insert(name, value)))
            except ValueError as exc:
                outcomes.append(exc)
        await asyncio.to_thread(store.close)
        return outcomes

    outcomes = asyncio.run(main())
    assert [o if isinstance(o, int) else str(o) for o in outcomes] == [
        0, 1, 2, "c3 refused", 4, 5, 6, 7, "alone-bad refused", 9]
    reopened = sqlite3.connect(tmp_path / "dataflow.sqlite3")
    rows = dict(reopened.execute("SELECT name, value FROM counters").fetchall())
    reopened.close()
    assert rows == {**{f"c{i}": i for i in range(8) if i != 3}, "alone-good": 9}


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_a_job_s_counters_count_once_committed_and_a_reopened_store_has_them(
        tmp_path, synchronous):
    """The store owns the counters it commits: a committed job's are in memory and in
    the table, a failed job's in neither, and a store opened again reads them back."""
    from collections import Counter

    store = Store(tmp_path, synchronous)

    def fail(conn: sqlite3.Connection) -> None:
        raise ValueError("refused")

    async def main() -> None:
        store.start()
        await store.run(lambda conn: None, Counter(accepted=2, produced=5))
        with pytest.raises(ValueError):
            await store.run(fail, Counter(accepted=100))
        await store.run(lambda conn: None, Counter(accepted=1))
        await asyncio.to_thread(store.close)

    asyncio.run(main())
    assert store.counters == Counter(accepted=3, produced=5)
    again = Store(tmp_path, synchronous)
    again.load()
    assert again.counters == Counter(accepted=3, produced=5)
    again.close()
