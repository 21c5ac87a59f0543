"""A headprune deci export's record read back by hand: the file's query slots of the kept heads (zero-weight padding
left out), and a deci file without the record, or with one its counts contradict, refused in one line."""

from __future__ import annotations

import json
import re

import pytest

from headprune.errors import HeadpruneError
from headprune.io.read.gguf_deci import DeciRecord


class Meta:
    """Just what DeciRecord reads of a GGUF's metadata."""

    arch = "deci"

    def __init__(self, record, heads, kv_heads):
        self.values = {"headprune.export": None if record is None else json.dumps(record),
                       "deci.attention.head_count": heads, "deci.attention.head_count_kv": kv_heads,
                       "deci.block_count": len(heads)}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def model(self, key, default=None):
        return self.values.get(f"deci.{key}", default)

    def need(self, key):
        return self.values[f"deci.{key}"]


def test_query_slots_skip_the_padding_of_uneven_groups():
    """9 heads over 3 KV heads (r = 3). Layer 0 keeps 0 and 4, 5 (KV heads 0, 1: r_0 = 2, head 0's group padded
    with one zero head): slots 0 | 2, 3. Layer 1 keeps nothing (one zero head); layer 2 keeps 8 alone: slot 0."""
    rec = DeciRecord(Meta({"n_heads": 9, "n_kv_heads": 3, "kept_heads": [[0, 4, 5], [], [8]]}, [4, 1, 1], [2, 1, 1]))
    assert rec.group == 3 and rec.kv_of(0) == [0, 1] and rec.kv_of(2) == [2]
    assert [rec.query_slots(layer) for layer in range(3)] == [[0, 2, 3], [], [0]]


@pytest.mark.parametrize("record, heads, kv, message", [
    (None, [3], [1], "was not written by headprune"),
    ({"n_heads": 9, "kept_heads": [[0]]}, [1], [1], "was not written by headprune"),
    ({"n_heads": 9, "n_kv_heads": 3, "kept_heads": [[0, 4, 5]]}, [3], [1], "layer 0 has 3 query heads over 1 KV"),
    ({"n_heads": 9, "n_kv_heads": 3, "kept_heads": [[0, 1, 2]]}, [2], [1], "layer 0 has 2 query heads over 1 KV"),
    ({"n_heads": 9, "n_kv_heads": 3, "kept_heads": [[0, 12]]}, [2], [1], "keeps heads [0, 12] in layer 0"),
    ({"n_heads": 9, "n_kv_heads": 3, "kept_heads": [[0], [1]]}, [1], [1], "do not match its 1 blocks"),
])
def test_a_deci_file_headprune_did_not_write_or_that_contradicts_its_record_is_refused(record, heads, kv, message):
    with pytest.raises(HeadpruneError, match=re.escape(message)):
        DeciRecord(Meta(record, heads, kv))
