"""FlashAttention-2-style attention in Triton, forward and backward, with the masks of cramming.model.attention.

Same semantics as `eager_attention` (key padding, causal, local window, ALiBi; a query that sees nothing outputs
zeros). The forward keeps a running max and sum per query row (online softmax), so memory is linear in the
sequence length; it saves O and the log-sum-exp, and the backward recomputes the probabilities from them.
The backward is two kernels without atomics (dK/dV per key block, dQ per query block), so it is deterministic.

Key blocks that no query of a block can see are never visited (the loop bounds follow causal/window), and the
position masks are only evaluated on the blocks that straddle a boundary: each program runs up to three loops,
masked / unmasked / masked. Scores are kept in raw q.k units and turned into base-2 logits by one multiply
(log2(e) folded into the scale), so exp2 is used throughout; the saved log-sum-exp is in natural-log units.
"""

import math
import os

import torch

from ..model.attention import ATTENTION_KERNELS

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is Linux-only; the model must stay importable everywhere.
    triton = None

if triton is not None:
    LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)

    @triton.jit
    def _alibi_step(h, H, sm_scale):
        """ALiBi slope of head h over sm_scale (the bias per unit distance, in raw q.k units). Same recipe as
        model.attention.alibi_slopes: n = 2^floor(log2 H) geometric slopes, then every other slope of 2n."""
        hf = h.to(tl.float32)
        n = tl.exp2(tl.floor(tl.log2(tl.full([], H, tl.float32))))
        exponent = tl.where(hf < n, -8.0 * (hf + 1.0) / n, -4.0 * (2.0 * (hf - n) + 1.0) / n)
        return tl.exp2(exponent) / sm_scale

    @triton.jit
    def _mask_scores(s, q_idx, k_idx, key_ok, N, window, alibi_step, MASK_POS: tl.constexpr,
                     CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr):
        """Add ALiBi and set invisible keys to -inf. q_idx/k_idx are broadcastable index blocks, so the same code
        serves the (query, key) tiles of the forward/dQ and the transposed (key, query) tiles of dK/dV."""
        if ALIBI:
            s = s - alibi_step * tl.abs(q_idx - k_idx).to(tl.float32)
        if MASK_POS:  # only blocks crossing the sequence end or a causal/window boundary pay for this
            ok = k_idx < N
            if CAUSAL:
                ok = ok & (k_idx <= q_idx)
            if HAS_WINDOW:
                ok = ok & (tl.abs(q_idx - k_idx) <= window)
            s = tl.where(ok, s, float("-inf"))
        if HAS_PAD:
            s = tl.where(key_ok, s, float("-inf"))
        return s

    @triton.jit
    def _clamp_ranges(lo, full_lo, full_hi, hi):
        """Order the bounds as lo <= full_lo <= full_hi <= hi (an empty full range sits inside [lo, hi))."""
        full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
        full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
        return lo, full_lo, full_hi, hi

    @triton.jit
    def _key_range(m0, N, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                   HAS_WINDOW: tl.constexpr):
        """Keys [lo, hi) that queries [m0, m0 + BLOCK_M) may see; blocks in [full_lo, full_hi) need no position
        mask (every pair in them is visible and inside the sequence)."""
        lo = m0 * 0
        hi = m0 * 0 + N
        full_lo = lo
        full_hi = N // BLOCK_N * BLOCK_N
        if CAUSAL:  # keys j <= i
            hi = tl.minimum(hi, m0 + BLOCK_M)
            full_hi = tl.minimum(full_hi, (m0 + 1) // BLOCK_N * BLOCK_N)
        if HAS_WINDOW:  # keys j >= i - window (and j <= i + window unless causal)
            lo = tl.maximum(m0 - window, 0) // BLOCK_N * BLOCK_N
            full_lo = tl.cdiv(tl.maximum(m0 + BLOCK_M - 1 - window, 0), BLOCK_N) * BLOCK_N
            if not CAUSAL:
                hi = tl.minimum(hi, m0 + BLOCK_M + window)
                full_hi = tl.minimum(full_hi, (m0 + window + 1) // BLOCK_N * BLOCK_N)
        return _clamp_ranges(lo, full_lo, full_hi, hi)

    @triton.jit
    def _query_range(n0, N, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                     HAS_WINDOW: tl.constexpr):
        """The transpose of _key_range: queries [lo, hi) that may see keys [n0, n0 + BLOCK_N)."""
        lo = n0 * 0
        hi = n0 * 0 + N
        full_lo = lo
        full_hi = N // BLOCK_M * BLOCK_M
        if CAUSAL:  # queries i >= j
            lo = n0 // BLOCK_M * BLOCK_M
            full_lo = tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M
        if HAS_WINDOW:  # queries i <= j + window (and i >= j - window unless causal)
            hi = tl.minimum(hi, n0 + BLOCK_N + window)
            full_hi = tl.minimum(full_hi, (n0 + window + 1) // BLOCK_M * BLOCK_M)
            if not CAUSAL:
                lo = tl.maximum(n0 - window, 0) // BLOCK_M * BLOCK_M
                full_lo = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - window, 0), BLOCK_M) * BLOCK_M
        return _clamp_ranges(lo, full_lo, full_hi, hi)

    @triton.jit
    def _load_rows(ptrs, rows, cols, N, D, CHECK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
        """Load a (rows, head_dim) tile, masking rows past N and padded head dims only when they can occur."""
        if CHECK_ROWS:
            if EVEN_D:
                x = tl.load(ptrs, mask=rows[:, None] < N, other=0.0)
            else:
                x = tl.load(ptrs, mask=(rows[:, None] < N) & (cols[None, :] < D), other=0.0)
        else:
            if EVEN_D:
                x = tl.load(ptrs)
            else:
                x = tl.load(ptrs, mask=cols[None, :] < D, other=0.0)
        return x

    @triton.jit
    def _load_key_ok(kpm, cols, N, smn, CHECK: tl.constexpr):
        if CHECK:
            ok = tl.load(kpm + cols * smn, mask=cols < N, other=0) != 0
        else:
            ok = tl.load(kpm + cols * smn) != 0
        return ok

    @triton.jit
    def _load_lse2(lse_ptr, rows, N, CHECK: tl.constexpr):
        """Log-sum-exp in base-2 units; a row that sees nothing has lse -inf, read as +inf so that its P is 0."""
        if CHECK:
            lse = tl.load(lse_ptr + rows, mask=rows < N, other=float("-inf"))
        else:
            lse = tl.load(lse_ptr + rows)
        return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)

    # ---- forward -----------------------------------------------------------------------------------------------

    @triton.jit
    def _fwd_inner(acc, m_i, l_i, q, k_base, v_base, kpm, skn, svn, smn, offs_m, offs_d, start, end,
                   N, D, window, qk_scale, alibi_step, BLOCK_N: tl.constexpr, MASK_POS: tl.constexpr,
                   CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr,
                   EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        for n0 in range(start, end, BLOCK_N):
            n0 = tl.multiple_of(n0, BLOCK_N)
            offs_n = n0 + tl.arange(0, BLOCK_N)
            k = _load_rows(k_base + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
            key_ok = _load_key_ok(kpm, offs_n, N, smn, MASK_POS) if HAS_PAD else None
            s = _mask_scores(s, offs_m[:, None], offs_n[None, :], key_ok, N, window, alibi_step, MASK_POS,
                             CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI)
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet: avoid inf - inf
            p = tl.exp2(s * qk_scale - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = _load_rows(v_base + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def _attn_fwd(Q, K, V, Out, Lse, Kpm, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, smb, smn,
                  H, N, D, window, sm_scale, N_BUCKET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr,
                  ALIBI: tl.constexpr, EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        """One program: BLOCK_M queries of one (batch, head), looping over the key blocks they can see."""
        m0 = tl.program_id(0) * BLOCK_M
        pid_bh = tl.program_id(1)
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)  # int64: offsets may pass 2**31
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        qk_scale = sm_scale * LOG2E
        alibi_step = _alibi_step(h, H, sm_scale) if ALIBI else 0.0
        q = _load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D, True,
                       EVEN_D)
        k_base, v_base, kpm = K + b * skb + h * skh, V + b * svb + h * svh, Kpm + b * smb
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo, full_lo, full_hi, hi = _key_range(m0, N, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for i in tl.static_range(3):  # masked edge, unmasked middle, masked edge
            start = lo if i == 0 else (full_lo if i == 1 else full_hi)
            end = full_lo if i == 0 else (full_hi if i == 1 else hi)
            acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, kpm, skn, svn, smn, offs_m, offs_d,
                                       start, end, N, D, window, qk_scale, alibi_step, BLOCK_N, i != 1, CAUSAL,
                                       HAS_WINDOW, HAS_PAD, ALIBI, EVEN_D, DOT_PREC)
        seen = l_i > 0.0  # l_i >= 1 as soon as one key is visible
        out = acc / tl.where(seen, l_i, 1.0)[:, None]  # a row that sees nothing: acc is 0, output 0
        lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / LOG2E, float("-inf"))
        tl.store(Lse + pid_bh.to(tl.int64) * N + offs_m, lse, mask=offs_m < N)
        o_ptrs = Out + b * sob + h * soh + offs_m[:, None] * son + offs_d[None, :]
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))

    # ---- backward ----------------------------------------------------------------------------------------------

    @triton.jit
    def _attn_bwd_delta(Out, DO, Delta, sob, soh, son, sdb, sdh, sdn, H, N, D, BLOCK_M: tl.constexpr,
                        BLOCK_D: tl.constexpr):
        """delta_i = rowsum(dO_i * O_i), the softmax-backward correction, in fp32."""
        pid_bh = tl.program_id(1)
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < N) & (cols[None, :] < D)
        o = tl.load(Out + b * sob + h * soh + rows[:, None] * son + cols[None, :], mask=mask, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + cols[None, :], mask=mask, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(Delta + pid_bh.to(tl.int64) * N + rows, delta, mask=rows < N)

    @triton.jit
    def _dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_ptr, delta_ptr, sqn, sdn, offs_n, offs_d, start,
                    end, N, D, window, qk_scale, alibi_step, BLOCK_M: tl.constexpr, MASK_POS: tl.constexpr,
                    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr,
                    EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        """Works on transposed tiles (keys x queries), so no accumulator needs a transpose."""
        for m0 in range(start, end, BLOCK_M):
            m0 = tl.multiple_of(m0, BLOCK_M)
            offs_m = m0 + tl.arange(0, BLOCK_M)
            q = _load_rows(q_base + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D, MASK_POS, EVEN_D)
            do = _load_rows(do_base + offs_m[:, None] * sdn + offs_d[None, :], offs_m, offs_d, N, D, MASK_POS,
                            EVEN_D)
            lse2 = _load_lse2(lse_ptr, offs_m, N, MASK_POS)  # rows past N: +inf, so their P is 0
            if MASK_POS:
                delta = tl.load(delta_ptr + offs_m, mask=offs_m < N, other=0.0)
            else:
                delta = tl.load(delta_ptr + offs_m)
            s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)
            s_t = _mask_scores(s_t, offs_m[None, :], offs_n[:, None], key_ok, N, window, alibi_step, MASK_POS,
                               CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI)
            p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
        return dk, dv

    @triton.jit
    def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, Lse, Delta, Kpm, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                       sdb, sdh, sdn, sgb, sgh, sgn, smb, smn, H, N, D, window, sm_scale, N_BUCKET,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                       HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr, EVEN_D: tl.constexpr,
                       DOT_PREC: tl.constexpr):
        """One program: dK and dV of BLOCK_N keys, looping over the query blocks that see them. DK and DV share
        their strides (sg*)."""
        n0 = tl.program_id(0) * BLOCK_N
        pid_bh = tl.program_id(1)
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        qk_scale = sm_scale * LOG2E
        alibi_step = _alibi_step(h, H, sm_scale) if ALIBI else 0.0
        k = _load_rows(K + b * skb + h * skh + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d, N, D, True,
                       EVEN_D)
        v = _load_rows(V + b * svb + h * svh + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, True,
                       EVEN_D)
        key_ok = (_load_key_ok(Kpm + b * smb, offs_n, N, smn, True)[:, None]) if HAS_PAD else None
        q_base, do_base = Q + b * sqb + h * sqh, DO + b * sdb + h * sdh
        lse_ptr, delta_ptr = Lse + pid_bh.to(tl.int64) * N, Delta + pid_bh.to(tl.int64) * N
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo, full_lo, full_hi, hi = _query_range(n0, N, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for i in tl.static_range(3):
            start = lo if i == 0 else (full_lo if i == 1 else full_hi)
            end = full_lo if i == 0 else (full_hi if i == 1 else hi)
            dk, dv = _dkdv_inner(dk, dv, k, v, key_ok, q_base, do_base, lse_ptr, delta_ptr, sqn, sdn, offs_n,
                                 offs_d, start, end, N, D, window, qk_scale, alibi_step, BLOCK_M, i != 1, CAUSAL,
                                 HAS_WINDOW, HAS_PAD, ALIBI, EVEN_D, DOT_PREC)
        mask = (offs_n[:, None] < N) & (offs_d[None, :] < D)
        offs = b * sgb + h * sgh + offs_n[:, None] * sgn + offs_d[None, :]
        tl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
        tl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=mask)

    @triton.jit
    def _dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm, skn, svn, smn, offs_m, offs_d, start, end, N, D,
                  window, qk_scale, alibi_step, BLOCK_N: tl.constexpr, MASK_POS: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr,
                  EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        for n0 in range(start, end, BLOCK_N):
            n0 = tl.multiple_of(n0, BLOCK_N)
            offs_n = n0 + tl.arange(0, BLOCK_N)
            k = _load_rows(k_base + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            v = _load_rows(v_base + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
            key_ok = _load_key_ok(kpm, offs_n, N, smn, MASK_POS) if HAS_PAD else None
            s = _mask_scores(s, offs_m[:, None], offs_n[None, :], key_ok, N, window, alibi_step, MASK_POS,
                             CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI)
            p = tl.exp2(s * qk_scale - lse2[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
        return dq

    @triton.jit
    def _attn_bwd_dq(Q, K, V, DO, DQ, Lse, Delta, Kpm, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                     sgb, sgh, sgn, smb, smn, H, N, D, window, sm_scale, N_BUCKET, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                     HAS_PAD: tl.constexpr, ALIBI: tl.constexpr, EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        """One program: dQ of BLOCK_M queries, looping over the key blocks they see (same bounds as forward)."""
        m0 = tl.program_id(0) * BLOCK_M
        pid_bh = tl.program_id(1)
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        qk_scale = sm_scale * LOG2E
        alibi_step = _alibi_step(h, H, sm_scale) if ALIBI else 0.0
        q = _load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D, True,
                       EVEN_D)
        do = _load_rows(DO + b * sdb + h * sdh + offs_m[:, None] * sdn + offs_d[None, :], offs_m, offs_d, N, D,
                        True, EVEN_D)
        lse2 = _load_lse2(Lse + pid_bh.to(tl.int64) * N, offs_m, N, True)
        delta = tl.load(Delta + pid_bh.to(tl.int64) * N + offs_m, mask=offs_m < N, other=0.0)
        k_base, v_base, kpm = K + b * skb + h * skh, V + b * svb + h * svh, Kpm + b * smb
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo, full_lo, full_hi, hi = _key_range(m0, N, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for i in tl.static_range(3):
            start = lo if i == 0 else (full_lo if i == 1 else full_hi)
            end = full_lo if i == 0 else (full_hi if i == 1 else hi)
            dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm, skn, svn, smn, offs_m, offs_d, start, end,
                           N, D, window, qk_scale, alibi_step, BLOCK_N, i != 1, CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI,
                           EVEN_D, DOT_PREC)
        offs = b * sgb + h * sgh + offs_m[:, None] * sgn + offs_d[None, :]
        tl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))

    # ---- launch parameters: autotuned on CUDA; fixed small blocks under the interpreter -------------------------

    def _configs(triples):
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in triples]

    def _prune(configs, named_args, **kwargs):
        """Drop configs whose blocks are longer than the (power-of-two rounded) sequence, keeping at least one."""
        n = named_args["N_BUCKET"]
        fitting = [c for c in configs if max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= max(n, 32)]
        return fitting or configs[:1]

    _KEY = ["N_BUCKET", "BLOCK_D", "CAUSAL", "HAS_WINDOW", "HAS_PAD", "ALIBI", "DOT_PREC"]
    _TUNED = {
        "fwd": triton.autotune(_configs([(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4),
                                         (64, 64, 4, 3), (64, 32, 4, 4), (128, 128, 8, 2), (64, 128, 4, 3)]),
                               key=_KEY, prune_configs_by={"early_config_prune": _prune})(_attn_fwd),
        # dK/dV: BLOCK_N keys per program, BLOCK_M queries per step; dQ: the other way round.
        "dkdv": triton.autotune(_configs([(32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 8, 4), (64, 64, 4, 3),
                                          (32, 64, 4, 4), (64, 128, 8, 2), (16, 128, 4, 4)]),
                                key=_KEY, prune_configs_by={"early_config_prune": _prune})(_attn_bwd_dkdv),
        "dq": triton.autotune(_configs([(128, 32, 4, 3), (128, 64, 8, 3), (128, 32, 8, 4), (64, 64, 4, 3),
                                        (64, 32, 4, 4), (128, 64, 8, 2), (128, 16, 4, 4)]),
                              key=_KEY, prune_configs_by={"early_config_prune": _prune})(_attn_bwd_dq),
    }
    _PLAIN = {"fwd": _attn_fwd, "dkdv": _attn_bwd_dkdv, "dq": _attn_bwd_dq}


def _launch(name, grid_block, seq, batch_heads, args, meta, device):
    """Run kernel `name` on a (seq / grid_block, batch * heads) grid. Under the interpreter (or off CUDA) the blocks
    are a fixed 16x16 and nothing is autotuned: the interpreter would run every config."""
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        _PLAIN[name][(triton.cdiv(seq, 16), batch_heads)](*args, BLOCK_M=16, BLOCK_N=16, **meta)
    else:
        _TUNED[name][lambda m: (triton.cdiv(seq, m[grid_block]), batch_heads)](*args, **meta)


def _meta(q, causal, window, alibi, key_padding_mask):
    head_dim = q.shape[-1]
    block_d = max(16, triton.next_power_of_2(head_dim))
    tf32 = q.dtype == torch.float32 and q.is_cuda and torch.get_float32_matmul_precision() != "highest"
    return {"BLOCK_D": block_d, "CAUSAL": causal, "HAS_WINDOW": window is not None,
            "HAS_PAD": key_padding_mask is not None, "ALIBI": alibi, "EVEN_D": block_d == head_dim,
            "DOT_PREC": "tf32" if tf32 else "ieee"}


def _mask_args(q, key_padding_mask):
    """The padding mask as uint8 (a free view of a bool tensor) and its strides; q is a never-read stand-in."""
    if key_padding_mask is None:
        return q, 0, 0
    mask = key_padding_mask.bool().view(torch.uint8)
    return mask, mask.stride(0), mask.stride(1)


def _forward(q, k, v, key_padding_mask, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    out = torch.empty(batch, seq, heads, head_dim, device=q.device, dtype=q.dtype).transpose(1, 2)
    lse = torch.empty(batch, heads, seq, device=q.device, dtype=torch.float32)
    mask, smb, smn = _mask_args(q, key_padding_mask)
    args = (q, k, v, out, lse, mask, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], smb, smn,
            heads, seq, head_dim, window or 0, scale, triton.next_power_of_2(seq))
    _launch("fwd", "BLOCK_M", seq, batch * heads, args, _meta(q, causal, window, alibi, key_padding_mask), q.device)
    return out, lse


def _backward(q, k, v, out, lse, dout, key_padding_mask, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    if dout.stride(-1) != 1:  # e.g. the all-zero-stride gradient of .sum()
        dout = dout.contiguous()
    delta = torch.empty_like(lse)
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m = 16 if os.environ.get("TRITON_INTERPRET") == "1" else 64
    _attn_bwd_delta[(triton.cdiv(seq, block_m), batch * heads)](
        out, dout, delta, *out.stride()[:3], *dout.stride()[:3], heads, seq, head_dim, BLOCK_M=block_m,
        BLOCK_D=block_d)
    grads = [torch.empty(batch, seq, heads, head_dim, device=q.device, dtype=q.dtype).transpose(1, 2)
             for _ in range(3)]
    dq, dk, dv = grads
    mask, smb, smn = _mask_args(q, key_padding_mask)
    meta = _meta(q, causal, window, alibi, key_padding_mask)
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dk.stride()[:3], smb, smn,
              heads, seq, head_dim, window or 0, scale, triton.next_power_of_2(seq))
    _launch("dkdv", "BLOCK_N", seq, batch * heads, (q, k, v, dout, dk, dv, lse, delta, mask, *common), meta, q.device)
    _launch("dq", "BLOCK_M", seq, batch * heads, (q, k, v, dout, dq, lse, delta, mask, *common), meta, q.device)
    return dq, dk, dv


# torch.library custom ops: torch.compile keeps each as one opaque call in its graph (no graph break, no tracing
# into Triton); the fake functions tell it the output shapes and strides.
@torch.library.custom_op("cramming::flash_attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None,
                  causal: bool, window: int | None, alibi: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, key_padding_mask, causal, window, alibi, scale)


@_attention_op.register_fake
def _(q, k, v, key_padding_mask, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    out = q.new_empty(batch, seq, heads, head_dim).transpose(1, 2)
    return out, q.new_empty(batch, heads, seq, dtype=torch.float32)


@torch.library.custom_op("cramming::flash_attention_backward", mutates_args=())
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                           dout: torch.Tensor, key_padding_mask: torch.Tensor | None, causal: bool,
                           window: int | None, alibi: bool, scale: float
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, out, lse, dout, key_padding_mask, causal, window, alibi, scale)


@_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, key_padding_mask, causal, window, alibi, scale):
    batch, heads, seq, head_dim = q.shape
    return tuple(q.new_empty(batch, seq, heads, head_dim).transpose(1, 2) for _ in range(3))


def _setup_context(ctx, inputs, output):
    q, k, v, key_padding_mask, causal, window, alibi, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, key_padding_mask)
    ctx.options = (causal, window, alibi, scale)
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, dout, _dlse):
    q, k, v, out, lse, key_padding_mask = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(q, k, v, out, lse, dout, key_padding_mask, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_setup_context)


@ATTENTION_KERNELS.register("triton")
def flash_attention(q, k, v, key_padding_mask=None, causal=False, window=None, alibi=False, dropout_p=0.0,
                    stepped=None, topk=None, bias=None, scale=None, return_lse=False):
    """softmax(q k^T * scale + alibi, masked) v for (batch, heads, seq, head_dim) q, k, v of one dtype (fp16,
    bf16 or fp32; any strides). Returns a (batch, heads, seq, head_dim) view of a (batch, seq, heads, head_dim)
    tensor, and with return_lse also the fp32 (batch, heads, seq) natural-log log-sum-exp of the scores
    (-inf for a query that sees no key)."""
    if stepped is not None or topk is not None or bias is not None:
        raise ValueError("the Triton attention kernel implements global and local attention with padding, causal "
                         "and ALiBi masks; stepped, top-k and a learned score bias need the 'sdpa' or 'eager' kernel")
    if dropout_p > 0:
        raise ValueError("the Triton attention kernel has no dropout; set attention dropout to 0 or use the "
                         "'sdpa' or 'eager' kernel")
    if triton is None:
        raise RuntimeError("the 'triton' attention kernel needs triton, which is not importable here; use the "
                           "'sdpa' or 'eager' kernel")
    shapes = [tuple(t.shape) for t in (q, k, v)]
    if q.dim() != 4 or len(set(shapes)) != 1 or not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one (batch, heads, seq, head_dim) shape and dtype, got {shapes}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or q.shape[-1] > 256:
        raise ValueError(f"supported: fp16/bf16/fp32 and head_dim <= 256, got {q.dtype}, head_dim {q.shape[-1]}")
    if window is not None and window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (q.shape[0], q.shape[2]):
        raise ValueError(f"key_padding_mask must be (batch, seq), got {tuple(key_padding_mask.shape)}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))  # kernels assume unit stride on dim
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    window = None if window is None else min(int(window), q.shape[2])  # same mask; keeps int32 bounds in range
    out, lse = _attention_op(q, k, v, key_padding_mask, bool(causal), window, bool(alibi), scale)
    return (out, lse) if return_lse else out
