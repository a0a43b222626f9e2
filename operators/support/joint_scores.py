"""The attention probabilities a joint-attention recorder (``operators.support.joint_attention``)
reads off an MMDiT block: its queries and keys built as diffusers' processors build them, and
softmax(Q K^T / sqrt(d)) over every key in float32, summed over the heads, in chunks of queries of
at most ``CHUNK_BYTES``.

torch is imported inside the function that needs it.
"""

from __future__ import annotations

CHUNK_BYTES = 1 << 28          # at most this many bytes of float32 scores at once (per chunk of queries)


def _heads(x, heads: int, norm):
    """(B, S, heads * d) -> (B, heads, S, d), then the per-head norm (if any)."""
    x = x.unflatten(-1, (heads, -1)).transpose(1, 2)
    return x if norm is None else norm(x)


def project_queries_keys(attn, x):
    """Queries and keys of the sequence ``x`` as the processor builds them: (B, heads, S, d) each."""
    if getattr(attn, "fused_projections", False) and hasattr(attn, "to_qkv"):
        q, k, _ = attn.to_qkv(x).chunk(3, dim=-1)
    else:
        q, k = attn.to_q(x), attn.to_k(x)
    return _heads(q, attn.heads, getattr(attn, "norm_q", None)), _heads(k, attn.heads, getattr(attn, "norm_k", None))


def project_added_keys(attn, e):
    """Keys of the text ``e`` (the added projections of a joint block): (B, heads, L, d)."""
    if getattr(attn, "fused_projections", False) and hasattr(attn, "to_added_qkv"):
        _, k, _ = attn.to_added_qkv(e).chunk(3, dim=-1)
    else:
        k = attn.add_k_proj(e)
    return _heads(k, attn.heads, getattr(attn, "norm_added_k", None))


def attention_probabilities(q, k, start: int, n: int):
    """softmax(q k^T / sqrt(d)) in float32 over all keys, summed over the heads, in chunks of
    queries: ((B, S, n) the columns start..start+n, (B, S) each row's sum over all keys)."""
    import torch  # deferred: torch

    b, heads, positions, d = q.shape
    keys = k.shape[2]
    kt = k.float().transpose(-1, -2)
    scale = d ** -0.5
    kept = torch.empty(b, positions, n, dtype=torch.float32, device=q.device)
    total = torch.empty(b, positions, dtype=torch.float32, device=q.device)
    rows = max(1, CHUNK_BYTES // (4 * b * heads * keys))
    for r in range(0, positions, rows):
        p = (q[:, :, r:r + rows].float() @ kt).mul_(scale).softmax(dim=-1).sum(dim=1)   # (b, rows, keys)
        kept[:, r:r + rows] = p[..., start:start + n]
        total[:, r:r + rows] = p.sum(dim=-1)
        del p
    return kept, total


def kernel_probabilities(q, k, rows: tuple[int, int], col: int, n: int, scale=None, mask=None):
    """For a joint sequence as an attention kernel receives it, ``q``/``k`` (B, heads, S, d):
    softmax(scale q k^T + mask) in float32 over all keys for the image's query rows
    ``rows[0]:rows[1]``, summed over the heads, in chunks of rows: ((B, image rows, n) the text
    columns col..col+n, (B, image rows) each row's sum over all keys). ``scale``: the kernel's
    (None: 1/sqrt(d)); ``mask``: the kernel's, boolean (False: left out) or additive float, (B, S_k)
    or broadcastable to (B, heads, S, S_k)."""
    import torch  # deferred: torch

    b, heads, positions, d = q.shape
    if k.shape[1] != heads:                                   # grouped keys: each serves heads // k-heads queries
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
    keys = k.shape[2]
    kt = k.float().transpose(-1, -2)
    scale = d ** -0.5 if scale is None else float(scale)
    if mask is not None and mask.ndim == 2:
        mask = mask[:, None, None, :]
    first, last = rows
    kept = torch.empty(b, last - first, n, dtype=torch.float32, device=q.device)
    total = torch.empty(b, last - first, dtype=torch.float32, device=q.device)
    step = max(1, CHUNK_BYTES // (4 * b * heads * keys))
    for r in range(first, last, step):
        e = min(r + step, last)
        s = (q[:, :, r:e].float() @ kt).mul_(scale)
        if mask is not None:
            m = mask[..., r:e, :] if mask.shape[-2] > 1 else mask
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s.add_(m.float())
        p = s.softmax(dim=-1).sum(dim=1)                      # (b, rows, keys)
        kept[:, r - first:e - first] = p[..., col:col + n]
        total[:, r - first:e - first] = p.sum(dim=-1)
        del s, p
    return kept, total
