"""InitProducerId: every version clients send; ids durable and never reused; KIP-360 epoch bumps."""
import socket
import struct

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse


def call(broker, version, **fields):
    req = InitProducerIdRequest[version](transactional_id=None, transaction_timeout_ms=60000, **fields)
    req.with_header(correlation_id=1, client_id="pid-test")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(req.encode(header=True, framed=True))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        return InitProducerIdResponse.decode(sock.recv(size, socket.MSG_WAITALL), version=version, header=True)


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_every_version_hands_out_a_fresh_id(broker, version):
    first, second = call(broker, version), call(broker, version)
    assert first.error_code == second.error_code == 0
    assert first.producer_epoch == 0 and second.producer_id > first.producer_id >= 0


def test_ids_are_never_reused_after_a_crash(broker):
    before = {call(broker, 0).producer_id for _ in range(5)}
    broker.kill()
    broker.start()
    after = {call(broker, 4).producer_id for _ in range(5)}
    assert not before & after
    assert min(after) > max(before)


def test_kip360_bump_keeps_the_id_and_raises_the_epoch(broker):
    issued = call(broker, 4)
    bumped = call(broker, 4, producer_id=issued.producer_id, producer_epoch=issued.producer_epoch)
    assert (bumped.producer_id, bumped.producer_epoch) == (issued.producer_id, 1)
    stranger = call(broker, 4, producer_id=10**12, producer_epoch=3)  # an id this broker never issued
    assert stranger.producer_id != 10**12 and stranger.producer_epoch == 0
