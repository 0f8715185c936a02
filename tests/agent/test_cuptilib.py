"""Raw CUPTI buffers: walking records by their sizes and decoding them with numpy."""

import struct

import pytest

np = pytest.importorskip("numpy")
from exporter.agent import cuptilib as cl  # noqa: E402


def record(kind: int, start: int, end: int, dev: int, graph_id: int = 0, end_dev: int = 0) -> bytes:
    size = cl.RECORD_SIZE[kind]
    buf = bytearray(size)
    so, eo, do, go, edo = cl.FIELDS[kind]
    struct.pack_into("<I", buf, 0, kind)
    struct.pack_into("<Q", buf, so, start)
    struct.pack_into("<Q", buf, eo, end)
    struct.pack_into("<I", buf, do, dev)
    if go >= 0:
        struct.pack_into("<I", buf, go, graph_id)
    if edo >= 0:
        struct.pack_into("<I", buf, edo, end_dev)
    return bytes(buf)


T = 1_764_400_000_000_000_000  # a CLOCK_REALTIME ns timestamp in 2025


def test_walk_and_decode_a_mixed_buffer() -> None:
    buf = (
        record(cl.KIND_CONCURRENT_KERNEL, T, T + 2_000_000, 0)
        + record(cl.KIND_MEMCPY, T + 10, T + 500, 1)
        + record(cl.KIND_GRAPH_TRACE, T + 3_000_000, T + 3_044_000, 0x7FFFFFFF, end_dev=0)
        + record(cl.KIND_CONCURRENT_KERNEL, T + 5, T + 7, 0, graph_id=12)
        + record(cl.KIND_MEMSET, T, 0, 0)  # still running at a forced flush: no end
    )
    offsets = cl.walk(buf)
    assert offsets is not None and offsets.tolist() == [0, 216, 312, 368, 584]
    d = cl.decode(buf, offsets)
    rows = sorted(
        zip(d.code.tolist(), d.dev.tolist(), (d.start - T).tolist(), (d.end - T).tolist(), strict=True)
    )
    assert rows == [(0, 0, 0, 2_000_000), (1, 1, 10, 500), (3, 0, 3_000_000, 3_044_000), (4, 0, 5, 7)]
    assert d.incomplete == 1


def test_homogeneous_kernel_buffer_takes_the_vector_path() -> None:
    buf = b"".join(record(cl.KIND_CONCURRENT_KERNEL, T + i * 10, T + i * 10 + 5, 0) for i in range(1213))
    offsets = cl.walk(buf)
    assert offsets is not None and offsets.tolist() == list(range(0, 1213 * 216, 216))
    assert int(cl.decode(buf, offsets).start.size) == 1213


def test_walk_gives_up_on_an_unknown_kind() -> None:
    buf = record(cl.KIND_MEMCPY, T, T + 1, 0) + struct.pack("<I", 5) + bytes(60)
    assert cl.walk(buf) is None


def test_api_version_reads_as_major_minor() -> None:
    assert cl.api_version_text(130001) == "13.0"
    assert cl.api_version_text(120800) == "12.8"


def test_cupti_attributes_parse_names_sizes_and_flags() -> None:
    got = cl.parse_attributes(
        "device_buffer_size=32m, ATTR_DEVICE_BUFFER_POOL_LIMIT=16,mem_allocation_type_host_pinned=1"
    )
    assert got == {
        "DEVICE_BUFFER_SIZE": 32 << 20,
        "DEVICE_BUFFER_POOL_LIMIT": 16,
        "MEM_ALLOCATION_TYPE_HOST_PINNED": 1,
    }
    assert cl.parse_attributes("") == {}
    assert cl.parse_attributes("device_buffer_size=0x1000") == {"DEVICE_BUFFER_SIZE": 4096}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("device_buffer=1m", "unknown CUPTI activity attribute 'device_buffer'"),
        ("device_buffer_size", "unknown CUPTI activity attribute"),
        ("device_buffer_size=lots", "is not a whole number"),
        ("mem_allocation_type_host_pinned=2", "out of range"),
        ("device_buffer_size=-1", "out of range"),
    ],
)
def test_bad_cupti_attributes_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        cl.parse_attributes(spec)
