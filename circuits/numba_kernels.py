"""The compiled loops of ``circuits.kernels`` (numba): imported only through it, which falls back to the
numpy paths where numba cannot be imported. Everything is float64 / complex128 / int64, so each
function compiles once (``cache=True``: later processes load the machine code from ``__pycache__``).

A state is a (2^n,) complex vector, wire 0 the most significant bit of its index (PennyLane's order).
Per layer l the circuit applies, in the order the ansatz says (``entangle_first``), the signed
permutation psi'[j] = sign[l, j] psi[inv[l, j]] (its CNOT/CZ gates) and one 2 x 2 matrix rot[l, w] per
wire. Multiply-adds may be fused (``FAST`` = fastmath ``contract``), but the sums are never
reassociated: with ``reassoc`` LLVM vectorised the helpers' loops differently when it compiled them
inlined into the caller (a process that compiles) and when it loaded them from numba's cache (every
later process), so a machine's first run and its reruns differed in the last bits. A fused
multiply-add stays inside the function that writes it, so compiled or loaded, a rerun gives the same bits.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

AXIS_X, AXIS_Y, AXIS_Z = 0, 1, 2
FAST = {"contract"}


@njit(cache=True, fastmath=FAST)
def _apply_wire(psi, n, wire, g00, g01, g10, g11):
    stride = 1 << (n - 1 - wire)
    size = psi.shape[0]
    for high in range(0, size, 2 * stride):
        for low in range(high, high + stride):
            a0 = psi[low]
            a1 = psi[low + stride]
            psi[low] = g00 * a0 + g01 * a1
            psi[low + stride] = g10 * a0 + g11 * a1


@njit(cache=True, fastmath=FAST)
def _permute(psi, out, inv, sign):
    for j in range(psi.shape[0]):
        out[j] = psi[inv[j]] * sign[j]


@njit(cache=True, fastmath=FAST)
def _unpermute(psi, out, fwd, sign):
    for i in range(psi.shape[0]):
        j = fwd[i]
        out[i] = psi[j] * sign[j]


@njit(cache=True, fastmath=FAST)
def pauli_rotations(weights, axes, rot, gen):
    """The per-wire matrices R = A_{k-1}(w_{k-1}) .. A_0(w_0) of weights (L, n, k), A_i the Pauli rotation
    exp(-i w P_i / 2) about axes[i], into rot (L, n, 2, 2); with gen (L, n, k, 2, 2) non-empty, also
    g_i = R^dagger dR/dw_i = C_i^dagger (-i P_i / 2) C_i with C_i = A_i .. A_0."""
    L, n, k = weights.shape
    with_gen = gen.shape[0] > 0
    for l in range(L):
        for w in range(n):
            c00, c01, c10, c11 = 1.0 + 0j, 0j, 0j, 1.0 + 0j  # C, built up one rotation at a time
            for i in range(k):
                half = 0.5 * weights[l, w, i]
                c, s = math.cos(half), math.sin(half)
                axis = axes[i]
                if axis == AXIS_X:  # [[c, -i s], [-i s, c]]
                    a00, a01, a10, a11 = c + 0j, -1j * s, -1j * s, c + 0j
                elif axis == AXIS_Y:  # [[c, -s], [s, c]]
                    a00, a01, a10, a11 = c + 0j, -s + 0j, s + 0j, c + 0j
                else:  # [[c - i s, 0], [0, c + i s]]
                    a00, a01, a10, a11 = complex(c, -s), 0j, 0j, complex(c, s)
                c00, c01, c10, c11 = (a00 * c00 + a01 * c10, a00 * c01 + a01 * c11,
                                      a10 * c00 + a11 * c10, a10 * c01 + a11 * c11)
                if with_gen:
                    # (-i P / 2) C
                    if axis == AXIS_X:
                        p00, p01, p10, p11 = -0.5j * c10, -0.5j * c11, -0.5j * c00, -0.5j * c01
                    elif axis == AXIS_Y:
                        p00, p01, p10, p11 = -0.5 * c10, -0.5 * c11, 0.5 * c00, 0.5 * c01
                    else:
                        p00, p01, p10, p11 = -0.5j * c00, -0.5j * c01, 0.5j * c10, 0.5j * c11
                    # C^dagger (.)
                    gen[l, w, i, 0, 0] = c00.conjugate() * p00 + c10.conjugate() * p10
                    gen[l, w, i, 0, 1] = c00.conjugate() * p01 + c10.conjugate() * p11
                    gen[l, w, i, 1, 0] = c01.conjugate() * p00 + c11.conjugate() * p10
                    gen[l, w, i, 1, 1] = c01.conjugate() * p01 + c11.conjugate() * p11
            rot[l, w, 0, 0] = c00
            rot[l, w, 0, 1] = c01
            rot[l, w, 1, 0] = c10
            rot[l, w, 1, 1] = c11


@njit(cache=True, fastmath=FAST)
def forward(angles, state_map, rot, inv, sign, entangle_first, readout, states, readouts):
    """Readouts (B, m) of encoding angles (B, n): each row's product state F (cos(t/2), sin(t/2)) per
    wire, the layers, then readout (m, 2^n) @ |psi|^2. states (B, 2^n): each row's final state, kept for
    ``backward`` (a (0, 2^n) array: not kept). When the rotations come first, the first layer's meet the
    product state: each wire's vector is rotated before the Kronecker product."""
    B, n = angles.shape
    L = rot.shape[0]
    size = 1 << n
    m = readout.shape[0]
    keep = states.shape[0] > 0
    psi = np.empty(size, np.complex128)
    tmp = np.empty(size, np.complex128)
    fold = (not entangle_first) and L > 0
    for b in range(B):
        psi[0] = 1.0
        filled = 1
        for w in range(n):
            c, s = math.cos(0.5 * angles[b, w]), math.sin(0.5 * angles[b, w])
            v0 = state_map[0, 0] * c + state_map[0, 1] * s
            v1 = state_map[1, 0] * c + state_map[1, 1] * s
            if fold:
                v0, v1 = rot[0, w, 0, 0] * v0 + rot[0, w, 0, 1] * v1, rot[0, w, 1, 0] * v0 + rot[0, w, 1, 1] * v1
            for i in range(filled - 1, -1, -1):
                x = psi[i]
                psi[2 * i + 1] = x * v1
                psi[2 * i] = x * v0
            filled *= 2
        for l in range(L):
            if entangle_first:
                _permute(psi, tmp, inv[l], sign[l])
                psi, tmp = tmp, psi
            if not (fold and l == 0):
                for w in range(n):
                    _apply_wire(psi, n, w, rot[l, w, 0, 0], rot[l, w, 0, 1], rot[l, w, 1, 0], rot[l, w, 1, 1])
            if not entangle_first:
                _permute(psi, tmp, inv[l], sign[l])
                psi, tmp = tmp, psi
        for j in range(size):
            tmp[j] = psi[j].real * psi[j].real + psi[j].imag * psi[j].imag
        for k in range(m):
            total = 0.0
            for j in range(size):
                total += tmp[j].real * readout[k, j]
            readouts[b, k] = total
        if keep:
            states[b, :] = psi


@njit(cache=True, fastmath=FAST)
def backward(states, grad_readouts, rot, gen, fwd, sign, entangle_first, readout, grad_weights):
    """The adjoint method from the final states (B, 2^n) and d loss / d readouts (B, m): d loss / d weights
    (L, n, k) into grad_weights. Per row the state and lambda = 2 (readout @ g) psi (torch's convention
    for d loss / d conj(psi)) walk back through the layers, un-applying each wire's R (R^dagger) and
    accumulating G[l, w] = sum over the other wires' bits of lambda_out psi_in^dagger, summed over the
    rows; then each weight's gradient is Re sum conj(R^dagger G) * g (g = R^dagger dR/dw, ``gen``)."""
    B, size = states.shape
    L, n = rot.shape[0], rot.shape[1]
    m = readout.shape[0]
    psi = np.empty(size, np.complex128)
    lam = np.empty(size, np.complex128)
    tmp = np.empty(size, np.complex128)
    acc = np.zeros((L, n, 2, 2), np.complex128)
    for b in range(B):
        for j in range(size):
            weight = 0.0
            for q in range(m):
                weight += readout[q, j] * grad_readouts[b, q]
            psi[j] = states[b, j]
            lam[j] = 2.0 * weight * states[b, j]
        for l in range(L - 1, -1, -1):
            if not entangle_first:
                _unpermute(psi, tmp, fwd[l], sign[l])
                psi, tmp = tmp, psi
                _unpermute(lam, tmp, fwd[l], sign[l])
                lam, tmp = tmp, lam
            for w in range(n - 1, -1, -1):
                # R^dagger on both, and G += lambda_out psi_in^dagger over the pairs of wire w
                h00 = rot[l, w, 0, 0].conjugate()
                h01 = rot[l, w, 1, 0].conjugate()
                h10 = rot[l, w, 0, 1].conjugate()
                h11 = rot[l, w, 1, 1].conjugate()
                stride = 1 << (n - 1 - w)
                g00, g01, g10, g11 = 0j, 0j, 0j, 0j
                for high in range(0, size, 2 * stride):
                    for low in range(high, high + stride):
                        p0, p1 = psi[low], psi[low + stride]
                        q0, q1 = lam[low], lam[low + stride]
                        i0 = h00 * p0 + h01 * p1
                        i1 = h10 * p0 + h11 * p1
                        i0c, i1c = i0.conjugate(), i1.conjugate()
                        g00 += q0 * i0c
                        g01 += q0 * i1c
                        g10 += q1 * i0c
                        g11 += q1 * i1c
                        psi[low], psi[low + stride] = i0, i1
                        lam[low] = h00 * q0 + h01 * q1
                        lam[low + stride] = h10 * q0 + h11 * q1
                acc[l, w, 0, 0] += g00
                acc[l, w, 0, 1] += g01
                acc[l, w, 1, 0] += g10
                acc[l, w, 1, 1] += g11
            if entangle_first:
                _unpermute(psi, tmp, fwd[l], sign[l])
                psi, tmp = tmp, psi
                _unpermute(lam, tmp, fwd[l], sign[l])
                lam, tmp = tmp, lam
    _weights_from_sums(acc, rot, gen, grad_weights)


@njit(cache=True, fastmath=FAST)
def _weights_from_sums(acc, rot, gen, grad_weights):
    """Each weight's gradient Re sum conj(R^dagger G) * g from every wire's G = sum lambda_out psi_in^dagger
    (acc (L, n, 2, 2)), its matrix R (rot) and generators g = R^dagger dR/dw (gen (L, n, k, 2, 2))."""
    L, n, k = grad_weights.shape
    for l in range(L):
        for w in range(n):
            # H = R^dagger G
            r00, r01, r10, r11 = rot[l, w, 0, 0], rot[l, w, 0, 1], rot[l, w, 1, 0], rot[l, w, 1, 1]
            g00, g01, g10, g11 = acc[l, w, 0, 0], acc[l, w, 0, 1], acc[l, w, 1, 0], acc[l, w, 1, 1]
            e00 = r00.conjugate() * g00 + r10.conjugate() * g10
            e01 = r00.conjugate() * g01 + r10.conjugate() * g11
            e10 = r01.conjugate() * g00 + r11.conjugate() * g10
            e11 = r01.conjugate() * g01 + r11.conjugate() * g11
            for i in range(k):
                grad_weights[l, w, i] = (e00.conjugate() * gen[l, w, i, 0, 0] + e01.conjugate() * gen[l, w, i, 0, 1]
                                         + e10.conjugate() * gen[l, w, i, 1, 0]
                                         + e11.conjugate() * gen[l, w, i, 1, 1]).real


@njit(cache=True, fastmath=FAST)
def forward_seeds(angles, state_map, rot, inv, sign, entangle_first, readout, states, readouts):
    """``forward`` of S weight sets, one call: angles (S, B, n), rot (S, L, n, 2, 2), states (S, B, 2^n)
    (or (S, 0, 2^n): not kept), readouts (S, B, m). Seed s runs ``forward`` itself on its own slices,
    so each seed's readouts and states are the bits of a single call on its weights."""
    for s in range(angles.shape[0]):
        forward(angles[s], state_map, rot[s], inv, sign, entangle_first, readout, states[s], readouts[s])


@njit(cache=True, fastmath=FAST)
def backward_seeds(states, grad_readouts, rot, gen, fwd, sign, entangle_first, readout, grad_weights):
    """``backward`` of S weight sets, one call: states (S, B, 2^n), grad_readouts (S, B, m), rot
    (S, L, n, 2, 2), gen (S, L, n, k, 2, 2), grad_weights (S, L, n, k); seed s runs ``backward`` itself."""
    for s in range(states.shape[0]):
        backward(states[s], grad_readouts[s], rot[s], gen[s], fwd, sign, entangle_first, readout, grad_weights[s])


# -- many rows: the same circuit and adjoint method on a batch-last state, the rows vectorised in the
# innermost loop (``circuits.kernels.columns_forward`` / ``columns_weight_grad``), in the head's
# precision (float32 for a complex64 head, float64 for complex128: numba compiles one version per
# dtype). The rows are walked in chunks of ``CHUNK`` columns, so a chunk's state and adjoint stay in
# the core's cache for the whole circuit. Each basis state of a chunk is one row of the work array:
# [Re psi | Im psi] (forward) or [Re psi | Im psi | Re lambda | Im lambda] (backward), CHUNK entries
# each. CHUNK is a compile-time constant and every lane loop runs all CHUNK lanes (a short last chunk is
# padded: angle 0, gradient 0), so every access of a loop is a constant offset from one or two row
# pointers and LLVM vectorises it without reassociating a sum (the gradient's sums over pairs are per
# lane; the lanes' sums are taken at the end of each wire, in lane order, in float64).
CHUNK = 128
LANE_STEP = 16  # a chunk's lanes are its rows rounded up to this (padded lanes: angle 0, gradient 0)


@njit(cache=True, fastmath=FAST)
def _columns_product(angles, state_map, c0, lanes, psi, vectors):
    """Rows of psi (2^n, >= 2 CHUNK) = the encoded product states (F (cos(t/2), sin(t/2)) per wire) of
    rows c0 .. c0 + lanes - 1 of angles (B, n) (lanes past B: angle 0), wire 0 the most significant
    bit; vectors (4 CHUNK,) scratch."""
    B, n = angles.shape
    cw = min(CHUNK, B - c0)
    row = psi[0]
    for b in range(lanes):
        row[b] = 1.0
        row[CHUNK + b] = 0.0
    filled = 1
    for w in range(n):
        for b in range(lanes):
            t = 0.5 * angles[c0 + b, w] if b < cw else 0.0
            c, s = math.cos(t), math.sin(t)
            v0 = state_map[0, 0] * c + state_map[0, 1] * s
            v1 = state_map[1, 0] * c + state_map[1, 1] * s
            vectors[b], vectors[CHUNK + b] = v0.real, v0.imag
            vectors[2 * CHUNK + b], vectors[3 * CHUNK + b] = v1.real, v1.imag
        for i in range(filled - 1, -1, -1):
            x, lo, hi = psi[i], psi[2 * i], psi[2 * i + 1]
            for b in range(lanes):
                r, q = x[b], x[CHUNK + b]
                hi[b] = r * vectors[2 * CHUNK + b] - q * vectors[3 * CHUNK + b]
                hi[CHUNK + b] = r * vectors[3 * CHUNK + b] + q * vectors[2 * CHUNK + b]
                lo[b] = r * vectors[b] - q * vectors[CHUNK + b]
                lo[CHUNK + b] = r * vectors[CHUNK + b] + q * vectors[b]
        filled *= 2


@njit(cache=True, fastmath=FAST)
def _columns_permute(psi, out, index, sign, gather, parts, lanes):
    """out = the signed permutation of the rows of psi (2^n, parts CHUNK), each part's first ``lanes``
    entries: with ``gather``
    out[j] = sign[j] psi[index[j]] (index: the layer's inverse), else out[i] = sign[index[i]] psi[index[i]]
    (index: its forward permutation, undoing the layer)."""
    for j in range(psi.shape[0]):
        k = index[j]
        s = sign[j] if gather else sign[k]
        src, dst = psi[k], out[j]
        for part in range(parts):
            for b in range(lanes):
                dst[part * CHUNK + b] = s * src[part * CHUNK + b]


@njit(cache=True, fastmath=FAST)
def _columns_wire(psi, stride, a, lanes):
    """The 2 x 2 matrix a (2, 2, 2: [row, col, re/im], the state's real dtype) on a wire of psi
    (2^n, >= 2 CHUNK) rows; every row's first 2 CHUNK entries."""
    a00r, a00i, a01r, a01i = a[0, 0, 0], a[0, 0, 1], a[0, 1, 0], a[0, 1, 1]
    a10r, a10i, a11r, a11i = a[1, 0, 0], a[1, 0, 1], a[1, 1, 0], a[1, 1, 1]
    size = psi.shape[0]
    for high in range(0, size, 2 * stride):
        for low in range(high, high + stride):
            s0, s1 = psi[low], psi[low + stride]
            for b in range(lanes):
                x0r, x0i, x1r, x1i = s0[b], s0[CHUNK + b], s1[b], s1[CHUNK + b]
                s0[b] = a00r * x0r - a00i * x0i + a01r * x1r - a01i * x1i
                s0[CHUNK + b] = a00r * x0i + a00i * x0r + a01r * x1i + a01i * x1r
                s1[b] = a10r * x0r - a10i * x0i + a11r * x1r - a11i * x1i
                s1[CHUNK + b] = a10r * x0i + a10i * x0r + a11r * x1i + a11i * x1r


@njit(cache=True, fastmath=FAST)
def columns_forward(angles, state_map, rot, inv, sign, entangle_first, readout, states, readouts, work):
    """Readouts (B, m) float64 of encoding angles (B, n) float64: ``forward``'s circuit on chunks of
    CHUNK columns. rot (L, n, 2, 2, 2): each wire's matrix, [.., re/im] in the state's real dtype; work
    (2, 2^n, 2 CHUNK) scratch of that dtype. states (2, 2^n, B): the final states (re, im), kept for
    ``columns_backward`` (a (2, 2^n, 0) array: not kept)."""
    B, n = angles.shape
    L = rot.shape[0]
    size = 1 << n
    m = readout.shape[0]
    keep = states.shape[2] > 0
    acc = np.empty((m, CHUNK))
    vectors = np.empty(4 * CHUNK, work.dtype)
    prob = np.empty(CHUNK, work.dtype)
    for c0 in range(0, B, CHUNK):
        cw = min(CHUNK, B - c0)
        lanes = min(CHUNK, (cw + LANE_STEP - 1) // LANE_STEP * LANE_STEP)
        psi, tmp = work[0], work[1]
        _columns_product(angles, state_map, c0, lanes, psi, vectors)
        for l in range(L):
            if entangle_first:
                _columns_permute(psi, tmp, inv[l], sign[l], True, 2, lanes)
                psi, tmp = tmp, psi
            for w in range(n):
                _columns_wire(psi, 1 << (n - 1 - w), rot[l, w], lanes)
            if not entangle_first:
                _columns_permute(psi, tmp, inv[l], sign[l], True, 2, lanes)
                psi, tmp = tmp, psi
        for k in range(m):
            for b in range(lanes):
                acc[k, b] = 0.0
        for j in range(size):
            row = psi[j]
            for b in range(lanes):
                prob[b] = row[b] * row[b] + row[CHUNK + b] * row[CHUNK + b]
            for k in range(m):
                weight = readout[k, j]
                if weight != 0.0:
                    ak = acc[k]
                    for b in range(lanes):
                        ak[b] += weight * prob[b]
        for b in range(cw):
            for k in range(m):
                readouts[c0 + b, k] = acc[k, b]
        if keep:
            for j in range(size):
                row = psi[j]
                re, im = states[0, j], states[1, j]
                for b in range(cw):
                    re[c0 + b] = row[b]
                    im[c0 + b] = row[CHUNK + b]


@njit(cache=True, fastmath=FAST)
def _columns_unapply(both, stride, a, g, lanes):
    """Un-apply a wire's matrix a (R, (2, 2, 2) real dtype: R^dagger is applied) to psi and lambda, the
    rows of both (2^n, 4 CHUNK), and add lambda_out psi_in^dagger over the wire's pairs into g
    (8 CHUNK,): per lane [G00, G01, G10, G11] as (re, im)."""
    h00r, h00i, h01r, h01i = a[0, 0, 0], -a[0, 0, 1], a[1, 0, 0], -a[1, 0, 1]
    h10r, h10i, h11r, h11i = a[0, 1, 0], -a[0, 1, 1], a[1, 1, 0], -a[1, 1, 1]
    size = both.shape[0]
    C = CHUNK
    for high in range(0, size, 2 * stride):
        for low in range(high, high + stride):
            s0, s1 = both[low], both[low + stride]
            for b in range(lanes):
                x0r, x0i, x1r, x1i = s0[b], s0[C + b], s1[b], s1[C + b]
                u0r = h00r * x0r - h00i * x0i + h01r * x1r - h01i * x1i
                u0i = h00r * x0i + h00i * x0r + h01r * x1i + h01i * x1r
                u1r = h10r * x0r - h10i * x0i + h11r * x1r - h11i * x1i
                u1i = h10r * x0i + h10i * x0r + h11r * x1i + h11i * x1r
                y0r, y0i, y1r, y1i = s0[2 * C + b], s0[3 * C + b], s1[2 * C + b], s1[3 * C + b]
                g[b] += y0r * u0r + y0i * u0i
                g[C + b] += y0i * u0r - y0r * u0i
                g[2 * C + b] += y0r * u1r + y0i * u1i
                g[3 * C + b] += y0i * u1r - y0r * u1i
                g[4 * C + b] += y1r * u0r + y1i * u0i
                g[5 * C + b] += y1i * u0r - y1r * u0i
                g[6 * C + b] += y1r * u1r + y1i * u1i
                g[7 * C + b] += y1i * u1r - y1r * u1i
                s0[b], s0[C + b], s1[b], s1[C + b] = u0r, u0i, u1r, u1i
                s0[2 * C + b] = h00r * y0r - h00i * y0i + h01r * y1r - h01i * y1i
                s0[3 * C + b] = h00r * y0i + h00i * y0r + h01r * y1i + h01i * y1r
                s1[2 * C + b] = h10r * y0r - h10i * y0i + h11r * y1r - h11i * y1i
                s1[3 * C + b] = h10r * y0i + h10i * y0r + h11r * y1i + h11i * y1r


@njit(cache=True, fastmath=FAST)
def columns_backward(states, weights_rows, rot, rot_exact, gen, fwd, sign, entangle_first, grad_weights, work):
    """``backward`` on chunks of CHUNK columns from ``columns_forward``'s final states (2, 2^n, B) and
    weights_rows (2^n, B) = readout^T (d loss / d readouts)^T (so lambda = 2 weights_rows psi): d loss /
    d weights (L, n, k) into grad_weights. rot: the wires'
    matrices as ``columns_forward`` took them; rot_exact (L, n, 2, 2) complex128 and gen as ``backward``'s;
    work (2, 2^n, 4 CHUNK) scratch of the state's real dtype."""
    size, B = states.shape[1], states.shape[2]
    L, n = rot.shape[0], rot.shape[1]
    C = CHUNK
    acc = np.zeros((L, n, 2, 2), np.complex128)
    g = np.empty(8 * C, states.dtype)
    total = np.empty(8)
    for c0 in range(0, B, C):
        cw = min(C, B - c0)
        lanes = min(C, (cw + LANE_STEP - 1) // LANE_STEP * LANE_STEP)
        both, tmp = work[0], work[1]
        for j in range(size):
            row, re, im, weight = both[j], states[0, j], states[1, j], weights_rows[j]
            for b in range(lanes):
                inside = b < cw
                xr = re[c0 + b] if inside else 0.0
                xi = im[c0 + b] if inside else 0.0
                scale = 2.0 * weight[c0 + b] if inside else 0.0
                row[b], row[C + b] = xr, xi
                row[2 * C + b] = scale * xr
                row[3 * C + b] = scale * xi
        for l in range(L - 1, -1, -1):
            if not entangle_first:
                _columns_permute(both, tmp, fwd[l], sign[l], False, 4, lanes)
                both, tmp = tmp, both
            for w in range(n - 1, -1, -1):
                for e in range(8):
                    for b in range(lanes):
                        g[e * C + b] = 0.0
                _columns_unapply(both, 1 << (n - 1 - w), rot[l, w], g, lanes)
                for e in range(8):
                    total[e] = 0.0
                    for b in range(lanes):
                        total[e] += g[e * C + b]
                acc[l, w, 0, 0] += complex(total[0], total[1])
                acc[l, w, 0, 1] += complex(total[2], total[3])
                acc[l, w, 1, 0] += complex(total[4], total[5])
                acc[l, w, 1, 1] += complex(total[6], total[7])
            if entangle_first:
                _columns_permute(both, tmp, fwd[l], sign[l], False, 4, lanes)
                both, tmp = tmp, both
    _weights_from_sums(acc, rot_exact, gen, grad_weights)


# -- the pauli executor's data side (``circuits.pauli``): the encoded wires' Bloch table, a tree of row products
# and the readouts' sums, fused over blocks of ``block`` rows so the tree's intermediate values stay in the
# core's cache. The values V hold the Bloch table's rows (4 per wire: 1 and the wire's rotated Bloch
# vector R_k e(t), e_a(t) = bloch[a, 0] + bloch[a, 1] cos t + bloch[a, 2] sin t) then the tree's internal
# entries in post-order: entry e is V[left[e]] * V[right[e]]. The angles come as their cosines and sines
# (n, B), which numpy's vectorised ufuncs compute outside. These take float32 or float64 arrays (one
# compiled version each).


@njit(cache=True, fastmath=FAST)
def _pauli_table(cos, sin, bloch, first, values, b0, w):
    """The block's Bloch table rows V[4k .. 4k+3] = (1, R_k e(t_k)) for every wire k."""
    a0, a1, a2 = bloch[0, 0], bloch[0, 1], bloch[0, 2]
    b0_, b1, b2 = bloch[1, 0], bloch[1, 1], bloch[1, 2]
    c0, c1, c2 = bloch[2, 0], bloch[2, 1], bloch[2, 2]
    for k in range(cos.shape[0]):
        f = first[k]
        f00, f01, f02, f10, f11, f12, f20, f21, f22 = (f[0, 0], f[0, 1], f[0, 2], f[1, 0], f[1, 1], f[1, 2],
                                                       f[2, 0], f[2, 1], f[2, 2])
        ck, sk = cos[k], sin[k]
        one, vx, vy, vz = values[4 * k], values[4 * k + 1], values[4 * k + 2], values[4 * k + 3]
        for c in range(w):
            co, si = ck[b0 + c], sk[b0 + c]
            e0 = a0 + a1 * co + a2 * si
            e1 = b0_ + b1 * co + b2 * si
            e2 = c0 + c1 * co + c2 * si
            one[c] = 1.0
            vx[c] = f00 * e0 + f01 * e1 + f02 * e2
            vy[c] = f10 * e0 + f11 * e1 + f12 * e2
            vz[c] = f20 * e0 + f21 * e1 + f22 * e2


@njit(cache=True, fastmath=FAST)
def _pauli_products(left, right, values, nt, w):
    for e in range(left.shape[0]):
        a, b, dst = values[left[e]], values[right[e]], values[nt + e]
        for c in range(w):
            dst[c] = a[c] * b[c]


@njit(cache=True, fastmath=FAST)
def _axpy(dst, coef, src, w):
    for c in range(w):
        dst[c] += coef * src[c]


@njit(cache=True, fastmath=FAST)
def pauli_readouts(cos, sin, bloch, first, left, right, pair_src, pair_read, pair_coef, m, block):
    """Readouts (m, B): out[pair_read[p]] += pair_coef[p] * V[pair_src[p]], from the angles' cosines and sines
    (n, B). (The sums go to a block's own (m, block) rows, then out: so written, LLVM vectorises them, 0.13 ->
    0.10 ms at 8 qubits.)"""
    n, B = cos.shape
    nt = 4 * n
    out = np.empty((m, B), cos.dtype)
    values = np.empty((nt + left.shape[0], block), cos.dtype)
    sums = np.empty((m, block), cos.dtype)
    for b0 in range(0, B, block):
        w = min(block, B - b0)
        _pauli_table(cos, sin, bloch, first, values, b0, w)
        _pauli_products(left, right, values, nt, w)
        sums[:, :] = 0.0
        for p in range(pair_src.shape[0]):
            _axpy(sums[pair_read[p]], pair_coef[p], values[pair_src[p]], w)
        for i in range(m):
            for c in range(w):
                out[i, b0 + c] = sums[i, c]
    return out


@njit(cache=True, fastmath=FAST)
def pauli_readouts_backward(cos, sin, bloch, first, left, right, pair_src, pair_read, pair_coef, grad, block):
    """The gradients of ``pauli_readouts`` in the angles (n, B), the first layer's matrices (n, 3, 3) and the
    pairs' coefficients (P,), given the readouts' gradient (m, B): the block's values recomputed, the tree's
    products run backwards, then the table's rows back to each wire's matrix and angle. The sums over rows
    (the coefficients', the matrices') run per lane in the arrays' dtype (so the loops vectorise: a
    scalar sum in the pairs' loop cost 0.15 of 0.36 ms at 8 qubits and 1,200 rows), the lanes then in
    float64, in a fixed order."""
    n, B = cos.shape
    nt = 4 * n
    R = left.shape[0]
    grad_angles = np.empty_like(cos)
    # the sums over rows, lane by lane (a row's lane: its index in its block), summed in float64 at the end:
    # each pair's g v, and each wire's g_i e_a
    coef_lanes = np.zeros((pair_src.shape[0], block), cos.dtype)
    lanes = np.zeros((n, 9, block), cos.dtype)
    values = np.empty((nt + R, block), cos.dtype)
    grads = np.empty((nt + R, block), cos.dtype)
    for b0 in range(0, B, block):
        w = min(block, B - b0)
        _pauli_table(cos, sin, bloch, first, values, b0, w)
        _pauli_products(left, right, values, nt, w)
        for r in range(nt + R):
            row = grads[r]
            for c in range(w):
                row[c] = 0.0
        for p in range(pair_src.shape[0]):
            v, g, dst, coef, lane = values[pair_src[p]], grad[pair_read[p]], grads[pair_src[p]], pair_coef[p], coef_lanes[p]
            for c in range(w):
                gc = g[b0 + c]
                lane[c] += gc * v[c]
                dst[c] += coef * gc
        for e in range(R - 1, -1, -1):
            g, a, b = grads[nt + e], values[left[e]], values[right[e]]
            ga, gb = grads[left[e]], grads[right[e]]
            for c in range(w):
                ga[c] += g[c] * b[c]
                gb[c] += g[c] * a[c]
        for k in range(n):
            f = first[k]
            ck, sk, out = cos[k], sin[k], grad_angles[k]
            gx, gy, gz, acc = grads[4 * k + 1], grads[4 * k + 2], grads[4 * k + 3], lanes[k]
            for c in range(w):
                co, si = ck[b0 + c], sk[b0 + c]
                e0 = bloch[0, 0] + bloch[0, 1] * co + bloch[0, 2] * si
                e1 = bloch[1, 0] + bloch[1, 1] * co + bloch[1, 2] * si
                e2 = bloch[2, 0] + bloch[2, 1] * co + bloch[2, 2] * si
                g0, g1, g2 = gx[c], gy[c], gz[c]
                acc[0, c] += g0 * e0
                acc[1, c] += g0 * e1
                acc[2, c] += g0 * e2
                acc[3, c] += g1 * e0
                acc[4, c] += g1 * e1
                acc[5, c] += g1 * e2
                acc[6, c] += g2 * e0
                acc[7, c] += g2 * e1
                acc[8, c] += g2 * e2
                d0 = f[0, 0] * g0 + f[1, 0] * g1 + f[2, 0] * g2  # d loss / d e_a = sum_i R[i, a] g_i
                d1 = f[0, 1] * g0 + f[1, 1] * g1 + f[2, 1] * g2
                d2 = f[0, 2] * g0 + f[1, 2] * g1 + f[2, 2] * g2
                out[b0 + c] = (d0 * (bloch[0, 2] * co - bloch[0, 1] * si) + d1 * (bloch[1, 2] * co - bloch[1, 1] * si)
                               + d2 * (bloch[2, 2] * co - bloch[2, 1] * si))
    grad_first = np.empty((n, 3, 3), np.float64)
    for k in range(n):
        for j in range(9):
            grad_first[k, j // 3, j % 3] = _lane_sum(lanes[k, j])
    grad_coef = np.empty(pair_src.shape[0], np.float64)
    for p in range(pair_src.shape[0]):
        grad_coef[p] = _lane_sum(coef_lanes[p])
    return grad_angles, grad_first.astype(cos.dtype), grad_coef.astype(cos.dtype)


@njit(cache=True, fastmath=FAST)
def _lane_sum(lane):
    total = 0.0
    for c in range(lane.shape[0]):
        total += lane[c]
    return total


# -- the pauli executor's weights side (``circuits.pauli.WeightsSide``): the layers' 3 x 3 adjoint matrices from
# the weights, and the coefficients pushed back through a rotation step, each with its backward. Small arrays,
# float64: loops instead of some forty small numpy calls a call.


@njit(cache=True, fastmath=FAST)
def pauli_adjoints(weights, generators, squares):
    """Each rotation's adjoint M = I + sin(w) K + (1 - cos(w)) K^2 (L, n, k, 3, 3) and each wire's product
    M_(k-1) ... M_0 (L, n, 3, 3), from the weights (L, n, k) and the rotations' K and K^2 (k, 3, 3)."""
    L, n, k = weights.shape
    each = np.empty((L, n, k, 3, 3))
    out = np.empty((L, n, 3, 3))
    tmp = np.empty((3, 3))
    for l in range(L):
        for q in range(n):
            for i in range(k):
                s, c = math.sin(weights[l, q, i]), 1.0 - math.cos(weights[l, q, i])
                for a in range(3):
                    for b in range(3):
                        each[l, q, i, a, b] = (1.0 if a == b else 0.0) + s * generators[i, a, b] + c * squares[i, a, b]
            out[l, q] = each[l, q, k - 1]
            for i in range(k - 2, -1, -1):
                for a in range(3):
                    for b in range(3):
                        tmp[a, b] = out[l, q, a, 0] * each[l, q, i, 0, b] + out[l, q, a, 1] * each[l, q, i, 1, b] \
                            + out[l, q, a, 2] * each[l, q, i, 2, b]
                out[l, q] = tmp
    return each, out


@njit(cache=True, fastmath=FAST)
def pauli_adjoints_backward(weights, each, grad, generators, squares):
    """d loss / d weights (L, n, k) from d loss / d (each wire's product) (L, n, 3, 3): dM_i = (M_(k-1) ...
    M_(i+1))^T G (M_(i-1) ... M_0)^T, and dM/dw = cos(w) K + sin(w) K^2."""
    L, n, k = weights.shape
    out = np.empty((L, n, k))
    left = np.empty((k, 3, 3))  # (M_(k-1) ... M_(i+1))^T G, for each i
    right = np.empty((3, 3))  # M_(i-1) ... M_0
    tmp = np.empty((3, 3))
    for l in range(L):
        for q in range(n):
            left[k - 1] = grad[l, q]
            for i in range(k - 2, -1, -1):
                for a in range(3):
                    for b in range(3):
                        left[i, a, b] = each[l, q, i + 1, 0, a] * left[i + 1, 0, b] + each[l, q, i + 1, 1, a] * left[i + 1, 1, b] \
                            + each[l, q, i + 1, 2, a] * left[i + 1, 2, b]
            for a in range(3):
                for b in range(3):
                    right[a, b] = 1.0 if a == b else 0.0
            for i in range(k):
                s, c = math.sin(weights[l, q, i]), math.cos(weights[l, q, i])
                total = 0.0
                for a in range(3):
                    for b in range(3):
                        d = left[i, a, 0] * right[b, 0] + left[i, a, 1] * right[b, 1] + left[i, a, 2] * right[b, 2]
                        total += d * (c * generators[i, a, b] + s * squares[i, a, b])
                out[l, q, i] = total
                for a in range(3):
                    for b in range(3):
                        tmp[a, b] = each[l, q, i, a, 0] * right[0, b] + each[l, q, i, a, 1] * right[1, b] \
                            + each[l, q, i, a, 2] * right[2, b]
                right[:, :] = tmp
    return out


@njit(cache=True, fastmath=FAST)
def pauli_rotation_step(old, src, dst, factors, table, size):
    """new[dst[e]] += old[src[e]] * prod_j table[factors[e, j]], in entry order."""
    m = old.shape[1]
    new = np.zeros((size, m))
    for e in range(src.shape[0]):
        scale = 1.0
        for j in range(factors.shape[1]):
            scale *= table[factors[e, j]]
        for c in range(m):
            new[dst[e], c] += old[src[e], c] * scale
    return new


@njit(cache=True, fastmath=FAST)
def pauli_rotation_step_backward(grad, old, src, dst, factors, table, grad_table):
    """The gradient of ``pauli_rotation_step``'s input (old's shape), given its output's; each table entry's
    gradient added into ``grad_table`` (the product of an entry's other factors, prefix times suffix)."""
    n = factors.shape[1]
    back = np.zeros(old.shape)
    prefix = np.empty(n + 1)
    m = old.shape[1]
    for e in range(src.shape[0]):
        prefix[0] = 1.0
        for j in range(n):
            prefix[j + 1] = prefix[j] * table[factors[e, j]]
        g_scale = 0.0
        for c in range(m):
            g = grad[dst[e], c]
            g_scale += g * old[src[e], c]
            back[src[e], c] += g * prefix[n]
        suffix = 1.0
        for j in range(n - 1, -1, -1):
            grad_table[factors[e, j]] += g_scale * prefix[j] * suffix
            suffix *= table[factors[e, j]]
    return back
