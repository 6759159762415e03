"""The Triton kernels of cramming/kernels/attention.py (read that file first: it holds the design notes and
the launch code). Forward, the backward's row-sum preprocess, dK/dV and dQ, plus their launch tables: autotuned
configs for CUDA (TUNED) and the plain kernels for fixed blocks under the interpreter (PLAIN).
"""

import inspect

from .tuning import CONFIGS, shared_bytes, shared_limit

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
    def _mask_scores(s, q_idx, k_idx, key_ok, same_doc, N, window, alibi_step, MASK_POS: tl.constexpr,
                     CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr,
                     HAS_DOCS: tl.constexpr):
        """Add ALiBi and set invisible keys to -inf. q_idx/k_idx are broadcastable index blocks, so the same code
        serves the (query, key) tiles of the forward/dQ and the transposed (key, query) tiles of dK/dV; same_doc
        is the tile's "query and key share a document" (document masking)."""
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
        if HAS_DOCS:
            s = tl.where(same_doc, s, float("-inf"))
        return s

    @triton.jit
    def _load_docs(docs, rows, N, sxn):
        """Document ids of `rows`; rows past N get -1, which no real token has (their scores are masked anyway)."""
        return tl.load(docs + rows * sxn, mask=rows < N, other=-1)

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
    def _fwd_inner(acc, m_i, l_i, q, k_base, v_base, kpm, skn, svn, smn, q_doc, docs, sxn, offs_m, offs_d, start,
                   end, N, D, window, qk_scale, alibi_step, BLOCK_N: tl.constexpr, MASK_POS: tl.constexpr,
                   CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr,
                   HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        for n0 in range(start, end, BLOCK_N):
            n0 = tl.multiple_of(n0, BLOCK_N)
            offs_n = n0 + tl.arange(0, BLOCK_N)
            k = _load_rows(k_base + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
            key_ok = _load_key_ok(kpm, offs_n, N, smn, MASK_POS) if HAS_PAD else None
            same_doc = (q_doc[:, None] == _load_docs(docs, offs_n, N, sxn)[None, :]) if HAS_DOCS else None
            s = _mask_scores(s, offs_m[:, None], offs_n[None, :], key_ok, same_doc, N, window, alibi_step, MASK_POS,
                             CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI, HAS_DOCS)
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
    def _attn_fwd(Q, K, V, Out, Lse, Kpm, Docs, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, smb,
                  smn, sxb, sxn, H, N, D, window, sm_scale, N_BUCKET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr,
                  ALIBI: tl.constexpr, HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        """One program: BLOCK_M queries of one (batch, head), looping over the key blocks they can see."""
        m0 = tl.program_id(1) * BLOCK_M
        pid_bh = tl.program_id(0)  # axis 0: batch * heads may pass CUDA's 65,535 cap on axes 1 and 2
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)  # int64: offsets may pass 2**31
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        qk_scale = sm_scale * LOG2E
        alibi_step = _alibi_step(h, H, sm_scale) if ALIBI else 0.0
        q = _load_rows(Q + b * sqb + h * sqh + offs_m[:, None] * sqn + offs_d[None, :], offs_m, offs_d, N, D, True,
                       EVEN_D)
        k_base, v_base, kpm, docs = K + b * skb + h * skh, V + b * svb + h * svh, Kpm + b * smb, Docs + b * sxb
        q_doc = _load_docs(docs, offs_m, N, sxn) if HAS_DOCS else None
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo, full_lo, full_hi, hi = _key_range(m0, N, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for i in tl.static_range(3):  # masked edge, unmasked middle, masked edge
            start = lo if i == 0 else (full_lo if i == 1 else full_hi)
            end = full_lo if i == 0 else (full_hi if i == 1 else hi)
            acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, kpm, skn, svn, smn, q_doc, docs, sxn,
                                       offs_m, offs_d, start, end, N, D, window, qk_scale, alibi_step, BLOCK_N,
                                       i != 1, CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI, HAS_DOCS, EVEN_D, DOT_PREC)
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
        pid_bh = tl.program_id(0)
        b, h = (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < N) & (cols[None, :] < D)
        o = tl.load(Out + b * sob + h * soh + rows[:, None] * son + cols[None, :], mask=mask, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + cols[None, :], mask=mask, other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        tl.store(Delta + pid_bh.to(tl.int64) * N + rows, delta, mask=rows < N)

    @triton.jit
    def _dkdv_inner(dk, dv, k, v, key_ok, k_doc, docs, sxn, q_base, do_base, lse_ptr, delta_ptr, sqn, sdn, offs_n,
                    offs_d, start, end, N, D, window, qk_scale, alibi_step, BLOCK_M: tl.constexpr,
                    MASK_POS: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr,
                    ALIBI: tl.constexpr, HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
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
            same_doc = (k_doc[:, None] == _load_docs(docs, offs_m, N, sxn)[None, :]) if HAS_DOCS else None
            s_t = _mask_scores(s_t, offs_m[None, :], offs_n[:, None], key_ok, same_doc, N, window, alibi_step,
                               MASK_POS, CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI, HAS_DOCS)
            p_t = tl.exp2(s_t * qk_scale - lse2[None, :])
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PREC)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PREC)
        return dk, dv

    @triton.jit
    def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, Lse, Delta, Kpm, Docs, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn,
                       sdb, sdh, sdn, sgb, sgh, sgn, smb, smn, sxb, sxn, H, N, D, window, sm_scale, N_BUCKET,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                       HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr, HAS_DOCS: tl.constexpr,
                       EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        """One program: dK and dV of BLOCK_N keys, looping over the query blocks that see them. DK and DV share
        their strides (sg*)."""
        n0 = tl.program_id(1) * BLOCK_N
        pid_bh = tl.program_id(0)
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
        docs = Docs + b * sxb
        k_doc = _load_docs(docs, offs_n, N, sxn) if HAS_DOCS else None
        q_base, do_base = Q + b * sqb + h * sqh, DO + b * sdb + h * sdh
        lse_ptr, delta_ptr = Lse + pid_bh.to(tl.int64) * N, Delta + pid_bh.to(tl.int64) * N
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lo, full_lo, full_hi, hi = _query_range(n0, N, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for i in tl.static_range(3):
            start = lo if i == 0 else (full_lo if i == 1 else full_hi)
            end = full_lo if i == 0 else (full_hi if i == 1 else hi)
            dk, dv = _dkdv_inner(dk, dv, k, v, key_ok, k_doc, docs, sxn, q_base, do_base, lse_ptr, delta_ptr, sqn,
                                 sdn, offs_n, offs_d, start, end, N, D, window, qk_scale, alibi_step, BLOCK_M,
                                 i != 1, CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI, HAS_DOCS, EVEN_D, DOT_PREC)
        mask = (offs_n[:, None] < N) & (offs_d[None, :] < D)
        offs = b * sgb + h * sgh + offs_n[:, None] * sgn + offs_d[None, :]
        tl.store(DK + offs, (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
        tl.store(DV + offs, dv.to(DV.dtype.element_ty), mask=mask)

    @triton.jit
    def _dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm, skn, svn, smn, q_doc, docs, sxn, offs_m, offs_d,
                  start, end, N, D, window, qk_scale, alibi_step, BLOCK_N: tl.constexpr, MASK_POS: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_PAD: tl.constexpr, ALIBI: tl.constexpr,
                  HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr, DOT_PREC: tl.constexpr):
        for n0 in range(start, end, BLOCK_N):
            n0 = tl.multiple_of(n0, BLOCK_N)
            offs_n = n0 + tl.arange(0, BLOCK_N)
            k = _load_rows(k_base + offs_n[:, None] * skn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            v = _load_rows(v_base + offs_n[:, None] * svn + offs_d[None, :], offs_n, offs_d, N, D, MASK_POS, EVEN_D)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
            key_ok = _load_key_ok(kpm, offs_n, N, smn, MASK_POS) if HAS_PAD else None
            same_doc = (q_doc[:, None] == _load_docs(docs, offs_n, N, sxn)[None, :]) if HAS_DOCS else None
            s = _mask_scores(s, offs_m[:, None], offs_n[None, :], key_ok, same_doc, N, window, alibi_step, MASK_POS,
                             CAUSAL, HAS_WINDOW, HAS_PAD, ALIBI, HAS_DOCS)
            p = tl.exp2(s * qk_scale - lse2[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
        return dq

    @triton.jit
    def _attn_bwd_dq(Q, K, V, DO, DQ, Lse, Delta, Kpm, Docs, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh,
                     sdn, sgb, sgh, sgn, smb, smn, sxb, sxn, H, N, D, window, sm_scale, N_BUCKET, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                     HAS_PAD: tl.constexpr, ALIBI: tl.constexpr, HAS_DOCS: tl.constexpr, EVEN_D: tl.constexpr,
                     DOT_PREC: tl.constexpr):
        """One program: dQ of BLOCK_M queries, looping over the key blocks they see (same bounds as forward)."""
        m0 = tl.program_id(1) * BLOCK_M
        pid_bh = tl.program_id(0)
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
        k_base, v_base, kpm, docs = K + b * skb + h * skh, V + b * svb + h * svh, Kpm + b * smb, Docs + b * sxb
        q_doc = _load_docs(docs, offs_m, N, sxn) if HAS_DOCS else None
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo, full_lo, full_hi, hi = _key_range(m0, N, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
        for i in tl.static_range(3):
            start = lo if i == 0 else (full_lo if i == 1 else full_hi)
            end = full_lo if i == 0 else (full_hi if i == 1 else hi)
            dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, kpm, skn, svn, smn, q_doc, docs, sxn, offs_m,
                           offs_d, start, end, N, D, window, qk_scale, alibi_step, BLOCK_N, i != 1, CAUSAL,
                           HAS_WINDOW, HAS_PAD, ALIBI, HAS_DOCS, EVEN_D, DOT_PREC)
        offs = b * sgb + h * sgh + offs_m[:, None] * sgn + offs_d[None, :]
        tl.store(DQ + offs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(offs_m[:, None] < N) & (offs_d[None, :] < D))

    # ---- launch parameters: autotuned on CUDA; fixed small blocks under the interpreter -------------------------

    def _configs(triples):
        return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in triples]

    def _pruner(kernel):
        def prune(configs, named_args, **kwargs):
            """Keep the configs whose shared memory fits the device (the same estimate the AOT check validates) and
            whose blocks are no longer than the (power-of-two rounded) sequence. flash_attention refuses a shape
            where nothing fits before it launches, so the list is never empty here."""
            q = named_args["Q"]
            limit = shared_limit(q.device)
            fits = [c for c in configs if shared_bytes(kernel, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages,
                                                       kwargs["BLOCK_D"], q.element_size()) <= limit]
            n = max(named_args["N_BUCKET"], 32)
            short = [c for c in fits if max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= n]
            return short or fits[-1:]
        return prune

    # Triton's on-disk autotune cache (cache_results, where this Triton has it): a new process, or the next
    # curriculum stage, reuses the timings of an earlier run instead of compiling and timing every config again.
    _CACHE = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    _KEY = ["N_BUCKET", "BLOCK_D", "CAUSAL", "HAS_WINDOW", "HAS_PAD", "ALIBI", "HAS_DOCS", "DOT_PREC"]
    TUNED = {name: triton.autotune(_configs(CONFIGS[name]), key=_KEY, prune_configs_by={"early_config_prune":
                                                                                      _pruner(name)}, **_CACHE)(fn)
             for name, fn in (("fwd", _attn_fwd), ("dkdv", _attn_bwd_dkdv), ("dq", _attn_bwd_dq))}
    PLAIN = {"fwd": _attn_fwd, "dkdv": _attn_bwd_dkdv, "dq": _attn_bwd_dq}
    DELTA = _attn_bwd_delta
