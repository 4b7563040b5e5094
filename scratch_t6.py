import torch, time
torch.set_num_threads(1)
from circuits import VQC
from circuits.shots import ShotSampler
def t(f, n=20):
    f(); s=time.perf_counter(); [f() for _ in range(n)]; return (time.perf_counter()-s)/n*1e3
m = VQC(4, 2, n_qubits=4, layers=2, ansatz="rzryrz_ring", observable="p0", output="relu_linear", scaling="atan", shots=1024)
x = torch.randn(1024, 4)
hw = m.hardware
with torch.no_grad():
    ang = m.angles(x)
    print("probs", t(lambda: hw.probabilities(m, ang, m.weights)))
    p = hw.probabilities(m, ang, m.weights)
    print("counts", t(lambda: hw.sampler.counts(p, 1024)))
    print("counts128", t(lambda: hw.sampler.counts(p, 128)))
    print("full", t(lambda: m(x)))
g = torch.Generator().manual_seed(0)
c = torch.full((1024, 8), 512., dtype=torch.float64); q = torch.rand(1024, 8, dtype=torch.float64)
print("binom f64 8k", t(lambda: torch.binomial(c, q, generator=g)))
c = c.float(); q = q.float()
print("binom f32 8k", t(lambda: torch.binomial(c, q, generator=g)))
print("binom f32 8k nogen", t(lambda: torch.binomial(c, q)))
