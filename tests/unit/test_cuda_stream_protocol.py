"""``Stream.__cuda_stream__`` follows the CUDA stream protocol (a method returning ``(0, handle)``)."""

from __future__ import annotations

from inflight.runtime.cuda import Stream


def test_cuda_stream_protocol_is_a_method_returning_version_and_handle() -> None:
    # a stream object without a device: the protocol reads only the handle the constructor stored
    s = Stream.__new__(Stream)
    s._handle = 0x7F00  # what cudaStreamCreateWithFlags returned (an integer-like cudaStream_t)
    assert callable(s.__cuda_stream__)
    assert s.__cuda_stream__() == (0, 0x7F00)
