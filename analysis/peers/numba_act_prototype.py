"""The measurement behind docs/circuits.md's numba figures: an 8-qubit act (Koelle-style strongly-entangling
head, 2 layers, angle encoding) as one compiled loop per row against circuits.adjoint.readouts_np, both
checked equal first. numba is not a dependency of marl-q: `pip install numba` to run this.

    python analysis/peers/numba_act_prototype.py        # pinned to CPU 0, CPU time, medians of 5
"""
import math
import os
import statistics
import sys
import time

import numpy as np

try:
    import numba as nb
except ImportError:
    print("numba_act_prototype: needs numba (pip install numba); it is not a dependency of marl-q", file=sys.stderr)
    sys.exit(2)
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {0})
from circuits.vqc import VQC
from circuits import adjoint as A
@nb.njit(fastmath=True, cache=False)
def act(angles, first, rot, inv, readout, out):
    B, n = angles.shape
    N = 1 << n
    L = rot.shape[0]
    m = readout.shape[1]
    psi = np.empty(N, np.complex64); tmp = np.empty(N, np.complex64)
    for b in range(B):
        psi[0] = 1.0
        size = 1
        for w in range(n):
            c = math.cos(0.5 * angles[b, w]); s = math.sin(0.5 * angles[b, w])
            v0 = first[w, 0, 0] * c + first[w, 0, 1] * s
            v1 = first[w, 1, 0] * c + first[w, 1, 1] * s
            for i in range(size - 1, -1, -1):
                x = psi[i]
                psi[2 * i + 1] = x * v1
                psi[2 * i] = x * v0
            size *= 2
        for j in range(N):
            tmp[j] = psi[inv[0, j]]
        psi, tmp = tmp, psi
        for l in range(1, L):
            for w in range(n):
                stride = 1 << (n - 1 - w)
                g00 = rot[l, w, 0, 0]; g01 = rot[l, w, 0, 1]; g10 = rot[l, w, 1, 0]; g11 = rot[l, w, 1, 1]
                for hi in range(0, N, 2 * stride):
                    for lo in range(stride):
                        i0 = hi + lo; i1 = i0 + stride
                        a0 = psi[i0]; a1 = psi[i1]
                        psi[i0] = g00 * a0 + g01 * a1
                        psi[i1] = g10 * a0 + g11 * a1
            for j in range(N):
                tmp[j] = psi[inv[l, j]]
            psi, tmp = tmp, psi
        for k in range(m):
            out[b, k] = 0.0
        for j in range(N):
            p = psi[j].real * psi[j].real + psi[j].imag * psi[j].imag
            if p != 0.0:
                for k in range(m):
                    out[b, k] += p * readout[j, k]
    return out
m = VQC(8, 5, n_qubits=8, layers=2, output="linear", scaling="atan", seed=0)
c = m.circuit; assert not c.entangle_first
w = m.weights.detach().numpy().astype(np.float64)
from circuits.blocks import ANSATZE
rot = ANSATZE[c.ansatz].matrices_np(w, c.options)  # (L, n, 2, 2)
first = (rot[0] @ c.state_map.numpy()).astype(np.complex64)
rot64 = rot.astype(np.complex64)
inv = np.stack([getattr(c, f"inverse_{l}").numpy() for l in range(2)]).astype(np.int64)
assert all(c.signs_trivial)
readout = c.readout.numpy().astype(np.float32)
rng = np.random.default_rng(0)
blocks = A.BlockMatrices(c, w, False)
def t(f, reps=3000):
    f(); vals=[]
    for _ in range(5):
        s=time.process_time()
        for _ in range(reps): f()
        vals.append((time.process_time()-s)/reps)
    return round(statistics.median(vals)*1e6,2)
for B in (1, 3, 64):
    ang = (2*np.arctan(rng.standard_normal((B, 8)))).astype(np.float32)
    out = np.empty((B, readout.shape[1]), np.float32)
    got = act(ang, first, rot64, inv, readout, out)
    want = A.readouts_np(c, ang, blocks)
    assert np.allclose(got, want, atol=1e-5), np.abs(got-want).max()
    print("B", B, "numba act", t(lambda: act(ang, first, rot64, inv, readout, out), 3000 if B < 10 else 300),
          "numpy readouts_np", t(lambda: A.readouts_np(c, ang, blocks), 3000 if B < 10 else 300))
