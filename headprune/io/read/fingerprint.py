"""The model fingerprint: a short hash of the config and every tensor, memoized per model, that tells whether a
scores, curves or progress file belongs to a model."""

from __future__ import annotations

import hashlib
import json
import weakref

import torch

from headprune.models.base import HeadModel

#: Tensors up to this many elements are hashed whole; larger ones by an evenly strided sample of about as many
#: (plus their sum), so GPT-2 XL costs about as much as a small model.
FINGERPRINT_SAMPLE = 1 << 20


_FINGERPRINTS: weakref.WeakKeyDictionary[HeadModel, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def model_fingerprint(model: HeadModel) -> str:
    """A short hash of the config and every tensor (name, shape, values rounded to bf16 so fp32, bf16 and fp16
    loads agree): tells whether a scores file, curves file or progress file belongs to a model.

    Every weight counts, not just attention: a fine-tune that changed only MLP, embedding or LayerNorm weights
    is another model whose scores must not be mixed with these. Memoized per model until a tensor is replaced or
    changed in place (its storage or version counter moves), so a run hashes its weights once."""

    config = json.dumps(model.cfg.as_dict(), sort_keys=True)
    state = model.state_dict()
    key = (config, tuple((name, t.data_ptr(), t._version) for name, t in state.items()))
    memo = _FINGERPRINTS.get(model)
    if memo is not None and memo[0] == key:
        return memo[1]
    h = hashlib.sha256(config.encode())
    for name, t in state.items():
        flat = t.detach().reshape(-1)
        h.update(f"{name}:{tuple(t.shape)}:".encode())
        if flat.numel() > FINGERPRINT_SAMPLE:  # strided sample, and a full-tensor sum that sees every element
            step = -(-flat.numel() // FINGERPRINT_SAMPLE)
            total = sum(float(c.to(torch.bfloat16).double().sum()) for c in flat.split(FINGERPRINT_SAMPLE))  # streamed
            h.update(f"{total:.9e}".encode())
            flat = flat[::step]
        h.update(flat.to(torch.bfloat16).float().cpu().numpy().tobytes())  # same for any dtype
    _FINGERPRINTS[model] = (key, h.hexdigest()[:16])
    return _FINGERPRINTS[model][1]
