"""The block format of W&B's `.wandb` transaction log: chunks, records, checksums.

wandb 0.31 ships no Python reader for an offline run's file (the reader lives in the Go
`wandb-core`); `nas.tracking.wandb.history` decodes the records, this module finds them.
The format (wandb-core's `pkg/leveldb`, the LevelDB log format with a W&B header):

* a 7-byte file header: b":W&B", magic 0xBEE1 (uint16, little-endian), version 0 (uint8);
* then 32 KiB blocks (the header counts toward the first one) of chunks, each a 7-byte
  chunk header: CRC-32 (uint32 LE; zlib's CRC-32 of the type byte then the data, i.e. the
  IEEE polynomial seeded with the type byte), data length (uint16 LE), type (uint8: 1
  FULL, 2 FIRST, 3 MIDDLE, 4 LAST), then the data; a block's tail shorter than a chunk
  header is zero padding;
* a record is one FULL chunk or FIRST, MIDDLE..., LAST joined; each record is a serialized
  `wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

__all__ = [
    "BLOCK_SIZE",
    "HEADER_SIZE",
    "LogScanner",
    "WandbLogError",
    "iter_chunks",
    "iter_records",
]

BLOCK_SIZE = 32 * 1024
HEADER_SIZE = 7  # both the file header and a chunk header
FILE_IDENT = b":W&B"
FILE_MAGIC = 0xBEE1
FILE_VERSION = 0
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbLogError(ValueError):
    """The file is not a W&B transaction log, or a record in it is corrupt."""


def _crc(chunk_type: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(bytes([chunk_type]))) & 0xFFFFFFFF


class LogScanner:
    """Walks the chunks and records of one file's bytes; remembers whether it was cut off."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data = data
        self.name = name
        self.truncated = False  # the data ends inside a chunk or a fragmented record

    def _header(self) -> None:
        data, name = self.data, self.name
        if len(data) < HEADER_SIZE:
            raise WandbLogError(f"{name}: {len(data)} bytes, too short for a W&B file header")
        ident, magic, version = struct.unpack("<4sHB", data[:HEADER_SIZE])
        if ident != FILE_IDENT or magic != FILE_MAGIC:
            raise WandbLogError(f"{name}: not a W&B transaction log (header {data[:7]!r})")
        if version != FILE_VERSION:
            raise WandbLogError(
                f"{name}: W&B log version {version}; this reader knows {FILE_VERSION}"
            )

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        self._header()
        data, name = self.data, self.name
        offset = HEADER_SIZE
        while offset < len(data):
            left_in_block = BLOCK_SIZE - offset % BLOCK_SIZE
            if left_in_block < HEADER_SIZE:  # the block's zero padding
                if data[offset : offset + left_in_block].strip(b"\x00"):
                    raise WandbLogError(f"{name}: non-zero padding at offset {offset}")
                offset += left_in_block
                continue
            if offset + HEADER_SIZE > len(data):
                self.truncated = True  # a cut-off chunk header
                return
            header = data[offset : offset + HEADER_SIZE]
            checksum, length, chunk_type = struct.unpack("<IHB", header)
            if header == bytes(HEADER_SIZE):  # zero-filled space (LevelDB's zero type)
                if not data[offset:].strip(b"\x00"):
                    return  # nothing but zeros to the end
                offset += left_in_block  # skip the rest of this block
                continue
            if HEADER_SIZE + length > left_in_block:
                raise WandbLogError(f"{name}: the chunk at offset {offset} overruns its block")
            start = offset + HEADER_SIZE
            if start + length > len(data):
                self.truncated = True  # cut-off chunk data
                return
            chunk = data[start : start + length]
            if _crc(chunk_type, chunk) != checksum:
                raise WandbLogError(f"{name}: bad checksum of the chunk at offset {offset}")
            yield chunk_type, chunk
            offset = start + length

    def records(self) -> Iterator[bytes]:
        name = self.name
        parts: list[bytes] | None = None
        for chunk_type, chunk in self.chunks():
            if chunk_type == FULL:
                if parts is not None:
                    raise WandbLogError(f"{name}: a FULL chunk inside a fragmented record")
                yield chunk
            elif chunk_type == FIRST:
                if parts is not None:
                    raise WandbLogError(f"{name}: a FIRST chunk inside a fragmented record")
                parts = [chunk]
            elif chunk_type in (MIDDLE, LAST):
                if parts is None:
                    raise WandbLogError(f"{name}: a MIDDLE or LAST chunk with no FIRST before it")
                parts.append(chunk)
                if chunk_type == LAST:
                    yield b"".join(parts)
                    parts = None
            else:
                raise WandbLogError(f"{name}: unknown chunk type {chunk_type}")
        if parts is not None:
            self.truncated = True


def iter_chunks(data: bytes, *, name: str = "<bytes>") -> Iterator[tuple[int, bytes]]:
    """(type, data) of every chunk after the file header, checksums verified.

    Raises `WandbLogError` for a bad file header, a bad checksum or non-zero padding. A
    chunk cut off by the end of the data (a file still being written, or a crash) ends the
    iteration quietly.
    """
    return LogScanner(data, name).chunks()


def iter_records(data: bytes, *, name: str = "<bytes>") -> Iterator[bytes]:
    """The serialized `Record`s: FULL chunks, and FIRST + MIDDLE... + LAST joined. A record
    left incomplete by the end of the data is not yielded."""
    return LogScanner(data, name).records()
