#!/usr/bin/python3
"""Debian's torchrun (torch 1.13) as a test peer on Python 3.11.

torch 1.13 parses -r/-t values by iterating an IntFlag, which Python 3.11
changed, so even the defaults ("0") raise. This wrapper parses those values
itself and then runs torchrun's main() unchanged.
"""
import sys

from torch.distributed.elastic.multiprocessing import api


def _parse_std(cls, text):
    if text.isdigit():
        return cls(int(text))
    mapping = {}
    for item in filter(None, text.split(",")):
        local_rank, value = item.split(":")
        mapping[int(local_rank)] = cls(int(value))
    return mapping


api.Std.from_str = classmethod(_parse_std)

from torch.distributed.run import main  # noqa: E402  (after the patch)

sys.exit(main())
