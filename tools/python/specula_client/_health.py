"""The one call of the standard gRPC health protocol the client needs (grpc.health.v1.Health/
Check), with its two one-field messages encoded by hand.

Why not generated stubs: a process may also import the official grpcio-health-checking package,
whose stubs register the same message names (grpc.health.v1.HealthCheckRequest); two
registrations from different .proto files make the second import fail. Encoding the wire format
directly registers nothing.
"""

from typing import Callable

import grpc

METHOD = "/grpc.health.v1.Health/Check"
# grpc.health.v1.HealthCheckResponse.ServingStatus
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int):
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint in HealthCheckResponse")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def encode_request(service: str) -> bytes:
    """HealthCheckRequest{service = 1}."""
    raw = service.encode("utf-8")
    return b"\x0a" + _varint(len(raw)) + raw if raw else b""


def decode_response(data: bytes) -> str:
    """The status name of a HealthCheckResponse{status = 1}; unknown fields are skipped."""
    status, pos = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
            if field == 1:
                status = value
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError("unexpected wire type %d in HealthCheckResponse" % wire_type)
    return STATUS_NAMES.get(status, "UNKNOWN")


def check_callable(channel: grpc.Channel) -> Callable:
    """A callable(service: str, timeout=...) -> status name."""
    return channel.unary_unary(METHOD, request_serializer=encode_request,
                               response_deserializer=decode_response)
