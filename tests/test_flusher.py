"""The broker's fsync threads: every flush submitted completes on the event loop, with its error if its fsync
failed, and a stopped flusher has synced everything queued before it stopped."""
import asyncio
import os

from kop.ledger.flusher import Flusher


async def test_every_flush_completes_on_the_loop_with_its_own_outcome(tmp_path):
    flusher = Flusher(threads=3)
    loop = asyncio.get_running_loop()
    fds = [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT) for i in range(10)]
    bad = os.open(tmp_path / "closed", os.O_RDWR | os.O_CREAT)
    os.close(bad)  # its fsync fails with EBADF
    outcomes: dict[int, object] = {}
    finished = loop.create_future()

    def done_for(i: int):
        def done(error):
            assert asyncio.get_running_loop() is loop  # called on the loop, not in a flusher thread
            outcomes[i] = error
            if len(outcomes) == 11 and not finished.done():
                finished.set_result(None)
        return done

    try:
        for i, fd in enumerate(fds):
            os.write(fd, b"x" * 100)
            flusher.submit([fd], done_for(i))
        flusher.submit([bad], done_for(10))
        await asyncio.wait_for(finished, 30)
    finally:
        flusher.stop()
        for fd in fds:
            os.close(fd)
    assert all(outcomes[i] is None for i in range(10))
    assert isinstance(outcomes[10], OSError)


async def test_stop_syncs_what_was_queued(tmp_path):
    flusher = Flusher(threads=1)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    synced = []
    try:
        for _ in range(5):
            flusher.submit([fd], synced.append)
        flusher.stop()  # joins the thread: every queued fsync ran
        await asyncio.sleep(0)  # the outcomes' callback runs on the loop
        await asyncio.sleep(0)
    finally:
        os.close(fd)
    assert synced == [None] * 5
